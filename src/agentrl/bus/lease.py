"""Leases in NATS KV: who owns a job, which controller is active.

A lease is a key in a bucket whose TTL is the lease's length (the bucket's `max_age`: each
write restarts the key's clock, so a holder that stops renewing loses the key when the
server expires it; no clocks are compared between hosts). Taking it is a create-only write,
renewing it a compare-and-set on the revision the holder last wrote: a holder that was away
longer than the TTL finds the revision moved (someone else holds it) and knows it lost. A
holder that restarts under the same owner name takes its own lease back at once.

One bucket per TTL (a bucket's TTL is fixed when it is created): `agentrl_leases_<ms>ms`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


def bucket_name(ttl_s: float) -> str:
    return f"agentrl_leases_{round(ttl_s * 1000)}ms"


async def lease_bucket(js: Any, ttl_s: float, replicas: int = 1) -> Any:
    """The lease bucket of this TTL, created when missing."""
    from nats.js.api import KeyValueConfig

    from agentrl.bus.kv import open_bucket

    config = KeyValueConfig(bucket=bucket_name(ttl_s), history=1, ttl=ttl_s, replicas=replicas)
    return await open_bucket(js, config)


def _value(entry: Any) -> dict[str, Any]:
    try:
        data = json.loads(entry.value or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


async def holder(kv: Any, key: str) -> str | None:
    """Who holds `key` now (None: nobody)."""
    from nats.js.errors import KeyDeletedError, KeyNotFoundError

    try:
        entry = await kv.get(key)
    except (KeyNotFoundError, KeyDeletedError):
        return None
    owner = _value(entry).get("owner")
    return str(owner) if owner else None


class Lease:
    """One lease: `acquire()` (create-only, or take back our own), `renew()` (CAS),
    `release()`. `held` says whether the last acquire/renew succeeded and its TTL has not
    run out since (a holder that cannot reach NATS stops acting before the key expires)."""

    def __init__(self, kv: Any, key: str, owner: str, ttl_s: float) -> None:
        self.kv = kv
        self.key = key
        self.owner = owner
        self.ttl_s = ttl_s
        self.revision: int | None = None
        # the revision at which this holder took the lease: its fencing token (revisions
        # of the bucket only grow, so a later holder's token is larger)
        self.token: int | None = None
        self._until = 0.0
        self.acquired_at: float | None = None

    @property
    def held(self) -> bool:
        return self.revision is not None and time.monotonic() < self._until

    @property
    def left_s(self) -> float:
        """Seconds until the lease runs out unless renewed (0 when not held)."""
        return max(0.0, self._until - time.monotonic()) if self.revision is not None else 0.0

    def _payload(self) -> bytes:
        return json.dumps({"owner": self.owner, "at": time.time()}).encode()

    async def acquire(self) -> bool:
        """Take the lease if nobody holds it (or we held it before a restart)."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError

        if self.held:
            return await self.renew()
        started = time.monotonic()
        try:
            self.revision = await self._create()
        except KeyWrongLastSequenceError:
            try:
                entry = await self.kv.get(self.key)
            except (KeyNotFoundError, KeyDeletedError):
                return False  # expired meanwhile: the next try takes it
            if _value(entry).get("owner") != self.owner:
                self.revision = None
                return False
            try:  # our own lease from before a restart
                self.revision = await self.kv.update(self.key, self._payload(), last=entry.revision)
            except KeyWrongLastSequenceError:
                self.revision = None
                return False
        self._until = started + self.ttl_s
        self.acquired_at = time.time()
        self.token = self.revision
        return True

    async def _create(self) -> int:
        """A create-only write. nats-py's `create` reads the key back after a conflict (to
        write over a delete marker); when the key expires between the two, that read raises
        KeyNotFoundError: the key is free now, so write again."""
        from nats.js.errors import KeyNotFoundError

        try:
            return int(await self.kv.create(self.key, self._payload()))
        except KeyNotFoundError:
            return int(await self.kv.create(self.key, self._payload()))

    async def renew(self) -> bool:
        """Extend the lease; False (and not held any more) when someone else has it. A lease
        that expired while NATS was away and that nobody took is taken again."""
        from nats.js.errors import KeyWrongLastSequenceError

        if self.revision is None:
            return False
        started = time.monotonic()
        try:
            self.revision = await self.kv.update(self.key, self._payload(), last=self.revision)
        except KeyWrongLastSequenceError:
            self.revision = None
            if await holder(self.kv, self.key) in (None, self.owner) and await self.acquire():
                return True
            log.warning("lease %s lost (%s): someone else holds it", self.key, self.owner)
            return False
        self._until = started + self.ttl_s
        return True

    async def release(self) -> None:
        """Give the lease up (only if still ours: a CAS delete)."""
        from nats.js.errors import KeyWrongLastSequenceError

        rev, self.revision = self.revision, None
        if rev is None:
            return
        with contextlib.suppress(KeyWrongLastSequenceError):
            await self.kv.delete(self.key, last=rev)


async def while_leader(
    lease: Lease,
    run: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    stop: asyncio.Event,
    *,
    retry_s: float | None = None,
    on_change: Callable[[bool], None] | None = None,
) -> None:
    """Stand by until `lease` is ours, then `run(leader_stop)` while renewing it every third
    of its TTL; `leader_stop` is set when the lease is lost (or `stop`), and we stand by
    again. `run` ending on its own while we lead is an error (raised)."""
    period = retry_s if retry_s is not None else lease.ttl_s / 3
    while not stop.is_set():
        try:
            got = await lease.acquire()
        except Exception as exc:  # NATS away: try again
            log.info("lease %s: cannot ask: %s", lease.key, exc)
            got = False
        if not got:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)
            continue
        log.info("lease %s taken by %s", lease.key, lease.owner)
        if on_change:
            on_change(True)
        leader_stop = asyncio.Event()
        task = asyncio.create_task(run(leader_stop), name=f"leader:{lease.key}")
        try:
            while not stop.is_set() and not task.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), lease.ttl_s / 3)
                if stop.is_set() or task.done():
                    break
                try:
                    ok = await lease.renew()
                except Exception as exc:
                    log.warning("lease %s: renewal failed: %s", lease.key, exc)
                    ok = lease.held
                if not ok:
                    break
        finally:
            leader_stop.set()
            await asyncio.wait({task}, timeout=30)
            if not task.done():  # it must not act on without the lease
                task.cancel()
                await asyncio.wait({task})
            if on_change:
                on_change(False)
        if task.done() and not task.cancelled() and task.exception() is not None:
            with contextlib.suppress(Exception):
                await lease.release()
            raise task.exception()  # type: ignore[misc]
        if stop.is_set():
            with contextlib.suppress(Exception):
                await lease.release()
            return
        if task.done() and lease.held:
            with contextlib.suppress(Exception):
                await lease.release()
            raise RuntimeError(f"the work under lease {lease.key} ended on its own")
        log.warning("lease %s lost by %s: standing by", lease.key, lease.owner)
