"""Listing a KV bucket's keys without leaking consumers.

nats-py's `KeyValue.keys()` watches the bucket through an ordered consumer that the server
keeps for five minutes after the call (its fixed `inactive_threshold`): a deployment
controller that lists its registry twice a second reached the server's consumer limit
within minutes (`maximum consumers limit reached`). Same listing, a consumer that goes
two seconds after the call.
"""

from __future__ import annotations

from typing import Any

INACTIVE_S = 2.0


async def kv_keys(kv: Any) -> list[str]:
    """The bucket's live keys (deleted and purged ones left out); [] for an empty bucket.

    The listing ends at the entry with nothing pending after it, not at nats-py's
    end-of-initial-values marker: that marker is put first when the consumer's info says
    nothing is pending while its messages still wait in the client's queue (a loaded host:
    a bucket with keys listed as empty, and a registry that seemed to have no models)."""
    timeout = float(getattr(getattr(kv, "_js", None), "_timeout", 5.0) or 5.0)
    watcher = await _watch(kv)
    live: dict[str, bool] = {}
    try:
        while True:
            entry = await watcher.updates(timeout=timeout)
            if entry is None:  # the marker: trust it only for a bucket with no message at all
                if await _empty(kv):
                    return []
                continue
            live[entry.key] = entry.operation not in _GONE
            if entry.delta == 0:
                return [k for k, alive in live.items() if alive]
    finally:
        await watcher.stop()


_GONE = frozenset({"DEL", "PURGE"})


async def _watch(kv: Any, tries: int = 3) -> Any:
    """`watchall` with a retry: on a loaded host the event loop can stall past
    `INACTIVE_S` between the consumer's creation and nats-py's `consumer_info`, and the
    server has dropped it ('consumer not found'): a fresh one is asked for."""
    from nats.js.errors import NotFoundError

    for attempt in range(tries):
        try:
            return await kv.watchall(meta_only=True, inactive_threshold=INACTIVE_S)
        except NotFoundError:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


async def _empty(kv: Any) -> bool:
    info = await kv._js.stream_info(kv._stream)
    return int(info.state.messages) == 0


async def open_bucket(js: Any, config: Any, *, deadline_s: float = 60.0) -> Any:
    """The bucket `config.bucket`, created with `config` when missing.

    Every service opens its buckets here, because on a cluster that is electing leaders (or
    a busy host) the first answer is often not the last: a create that timed out may have
    happened, another replica may be creating it at the same moment ('bad request', then
    'not found' while its stream is not yet visible), and the API can answer 503 or time
    out. All of those are asked again until `deadline_s`; anything else is raised. A bucket
    is returned once its stream has a leader: a fresh R3 bucket's first write otherwise
    found no stream to answer it ('no response from stream', seen under load).

    The tries give up sooner than `js` would (`FIRST_TRY_S`, doubling up to its timeout): a
    request sent while the cluster elects its meta leader is never answered, and waiting
    out a service's 5 s for each held a reward service started during a fail-over up to
    5 s past the cluster's return (measured: answered again at +10.7 s, opened at +13.7 s).
    The bucket returned is bound to `js`: its operations keep the caller's timeout."""
    import asyncio
    import time

    import nats.errors
    import nats.js.errors

    deadline = time.monotonic() + deadline_s
    attempt = 0
    while True:
        probe = sooner(js, FIRST_TRY_S * 2**attempt)
        try:
            try:
                await probe.key_value(config.bucket)
            except nats.js.errors.BucketNotFoundError:
                await probe.create_key_value(config)
            if await _has_leader(probe, config.bucket):
                return await js.key_value(config.bucket)
            raise nats.js.errors.ServiceUnavailableError  # no leader yet: ask again
        except (
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.errors.ConnectionReconnectingError,
            nats.js.errors.ServiceUnavailableError,
            nats.js.errors.BucketNotFoundError,  # created by another, not yet visible
            nats.js.errors.BadRequestError,  # created by another meanwhile
            nats.js.errors.ServerError,  # JetStream not ready on a node that just started
        ):
            task = asyncio.current_task()
            # a cancellation that reached a request as its timeout (asyncio.wait_for on
            # Python 3.11) must stop here, not be asked again until the deadline
            if time.monotonic() > deadline or (task is not None and task.cancelling()):
                raise
            attempt = min(attempt + 1, 8)
            await asyncio.sleep(0.5)


FIRST_TRY_S = 1.0  # the first try's timeout; it doubles up to the caller's


def sooner(js: Any, timeout: float) -> Any:
    """A JetStream context like `js` whose API requests give up after `timeout` (at most
    `js`'s own); `js` itself where it is not nats-py's context. Shared with `Bus._retry`:
    a request lost in an election is asked again sooner than a whole timeout."""
    own = getattr(js, "_timeout", None)
    nc, prefix = getattr(js, "_nc", None), getattr(js, "_prefix", None)
    if not isinstance(own, int | float) or nc is None or prefix is None or timeout >= own:
        return js
    return type(js)(nc, prefix=prefix, timeout=timeout)


async def _has_leader(js: Any, bucket: str) -> bool:
    """Whether the bucket's stream has elected a leader (always, on a single server)."""
    info = await js.stream_info(f"KV_{bucket}")
    cluster = getattr(info, "cluster", None)
    return cluster is None or bool(getattr(cluster, "leader", None))
