"""The JetStream client every agentrl service uses (over nats-py).

Publishing validates the event, sets `Nats-Msg-Id` to its id (so JetStream drops a
duplicate within the stream's duplicate window), awaits the PubAck and retries timeouts,
no-responders and leader elections with bounded backoff under the same id, so a retry never
stores a second copy. Consuming runs a durable pull consumer: ack after the handler
succeeded, nak with delay on a transient error, and dead-letter (RL_DLQ, with the reason and
the original bytes, or a reference to them when they do not fit) whatever fails validation
or keeps failing, so a poison message never blocks a stream and is never silently dropped.
A batch's acks are confirmed by the server before the batch counts as done.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, PubAck, StorageType, StreamConfig
from pydantic import BaseModel, ValidationError

from agentrl.bus import deadletter, wire
from agentrl.bus.kv import FIRST_TRY_S, sooner
from agentrl.contracts.base import Event, utcnow
from agentrl.contracts.streams import DLQ_PREFIX, STREAMS, StreamSpec, stream_for
from agentrl.contracts.subjects import model_for
from agentrl.core.errors import BusError, PayloadTooLargeError
from agentrl.core.settings import Settings, get_settings
from agentrl.observability import instrument as obs

log = logging.getLogger(__name__)

# The bus's instrumentation switch: `Bus.counters` (and whatever metrics the observability
# package attaches to them) are kept only while this is true; `agentrl bench bus` flips it
# to measure what instrumentation costs.
INSTRUMENTED = True

# Publish failures worth retrying under the same Msg-Id: the server or the stream's leader
# is away for a moment (a restart, a reconnect, a cluster electing a leader).
_RETRYABLE = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.ConnectionClosedError,
)

_API_RETRYABLE = (  # a JetStream API call's (`Bus._retry`); of APIError, 503 and 10005 only
    TimeoutError,  # nats.errors.TimeoutError too
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.APIError,
)

# Any call to a JetStream API or KV bucket that may succeed when tried again in a moment.
TRANSIENT = (*_RETRYABLE, nats.js.errors.ServiceUnavailableError)


class TransientError(BusError):
    """Raised by a handler: try this message again later (nak with delay)."""


class PermanentError(BusError):
    """Raised by a handler: this message can never succeed (dead-letter it now)."""


@dataclass
class Delivery:
    """One received message: its validated event (or raw bytes) and its JetStream handle."""

    msg: Msg
    event: Any

    @property
    def subject(self) -> str:
        return self.msg.subject

    @property
    def data(self) -> bytes:
        return self.msg.data

    @property
    def num_delivered(self) -> int:
        return _num_delivered(self.msg)

    async def in_progress(self) -> None:
        """Tell the server the handler is still working (resets the ack timer)."""
        await self.msg.in_progress()


_current: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar(
    "agentrl_delivery", default=None
)


def current_delivery() -> Delivery:
    """The message being handled, for handlers that need `in_progress()` or metadata."""
    delivery = _current.get()
    if delivery is None:
        raise BusError("current_delivery() called outside a consumer handler")
    return delivery


Outcomes = Sequence[BaseException | None] | None


@dataclass(frozen=True)
class Deferred:
    """A batch handler's answer whose outcomes come later, e.g. once a commit that runs in
    a worker thread is durable. The bus hands the handler the next batch meanwhile (work
    that does not need the commit overlaps it) and acks this batch only when `outcomes`
    is done; at most one batch waits like this. A failed `outcomes` fails the whole batch,
    as a batch handler raising would. `outcomes` must complete by itself (not wait for a
    later batch): the bus settles it before it hands over the batch after next."""

    outcomes: asyncio.Future[Outcomes]


Handler = Callable[[Any], Awaitable[None]]
# A batch handler gets the whole fetched batch and returns one outcome per delivery
# (None = done, an exception = failed like a single handler raising it), None for all done,
# or a `Deferred` of those.
BatchHandler = Callable[[list[Delivery]], Awaitable[Outcomes | Deferred]]


@dataclass
class _Waiting:
    """A handled batch whose `Deferred` outcomes are not in yet."""

    good: list[Delivery]
    acks: list[tuple[str, bytes]]  # its dead letters' terms, decided before the handler
    deferred: Deferred
    heartbeat: asyncio.Task[None]


@dataclass
class _Batches:
    """How one `consume` call handles fetched batches and settles the handled ones."""

    process: Callable[[list[Any]], Awaitable[None]]  # handle a batch: ack it, or defer it
    settle: Callable[[], Awaitable[None]]  # the deferred batch's acks, once its outcomes are in
    waiting: list[_Waiting]  # the batch whose `Deferred` outcomes are not in yet
    confirming: list[asyncio.Task[None]]  # the previous batch's ack confirmation
    confirmer: Any  # wire.AckConfirmer on the fast path, else None

    async def close(self) -> None:
        """At the end: the deferred batch settled and every ack confirmed."""
        await self.settle()
        await _confirmed(self.confirming)
        if self.confirmer is not None:
            await self.confirmer.close()


@dataclass
class ConsumeStats:
    received: int = 0
    acked: int = 0
    nakked: int = 0
    dead_lettered: int = 0
    batches: int = 0
    errors: list[str] = field(default_factory=list)
    # Batches whose acks the server did not confirm (they may be redelivered).
    unconfirmed_batches: int = 0
    # Dead letters that could not be stored even by reference (the original was still
    # terminated; its stream and sequence are in the log).
    dlq_failures: int = 0
    # time.monotonic() when the latest batch's acks were confirmed.
    confirmed_at: float = 0.0


class Bus:
    """An open connection to NATS with JetStream; create with `await Bus.connect()`."""

    def __init__(
        self,
        nc: NATS,
        *,
        publish_timeout: float = 5.0,
        publish_retries: int = 8,
        async_window: int = 2000,
        stream_replicas: int = 1,
        ack_confirm_timeout: float = 5.0,
        stall_timeout: float = 1.0,
        api_attempts: int = 8,
        close_timeout: float = 2.0,
    ) -> None:
        self.nc = nc
        # `close()` drains for at most this long, then closes: nats-py's own drain waits
        # 30 s for a subscription whose handler is still busy (or whose queue is read
        # without `task_done`), which held a stopping service that long.
        self.close_timeout = close_timeout
        self.api_attempts = api_attempts  # tries, in whole timeouts (`_retry`)
        self.js: JetStreamContext = nc.jetstream(
            timeout=publish_timeout, publish_async_max_pending=async_window
        )
        self.publish_timeout = publish_timeout
        self.publish_retries = publish_retries
        self.async_window = async_window
        self.stream_replicas = stream_replicas
        self.ack_confirm_timeout = ack_confirm_timeout
        # A pipelined publish round gives up on its unanswered messages after this long
        # without a single PubAck, and publishes them again (same Msg-Id): PubAcks lost
        # with a killed stream leader are re-sent as soon as a new leader can take them.
        self.stall_timeout = min(publish_timeout, stall_timeout)
        # Per-connection counts for monitoring: published, publish_retried, consumed,
        # acked, nakked, dead_lettered, dlq_failures, acks_unconfirmed.
        self.counters: Counter[str] = Counter()
        self._fast = wire.supported(nc)
        self._publisher = wire.AsyncPublisher(nc, async_window) if self._fast else None

    # ---- connection -------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        url: str | None = None,
        settings: Settings | None = None,
        name: str = "agentrl",
        **kw: Any,
    ) -> Bus:
        """Connect to `url` (or NATS_URL): one server, or a cluster's servers separated by
        commas (`nats://a:4222,nats://b:4222`); the client reconnects to any of them."""
        settings = settings or get_settings()
        url = url or settings.nats_url
        if not url:
            raise BusError("no NATS URL: pass one, set NATS_URL, or start `agentrl up`")
        servers = [u.strip() for u in url.split(",") if u.strip()]
        kw.setdefault("stream_replicas", settings.stream_replicas)
        options: dict[str, Any] = {
            "servers": servers,
            "name": name,
            # A few tries for the first connection, so a wrong URL or credentials fail fast;
            # once connected, reconnect forever (a restarting server must not end a service).
            "max_reconnect_attempts": 3,
            "error_cb": _log_connection_error,
            "reconnect_time_wait": 0.25,
            "connect_timeout": 5,
            "pending_size": 64 * 1024 * 1024,
        }
        if settings.nats_token:
            options["token"] = settings.nats_token
        elif settings.nats_user:
            options["user"] = settings.nats_user
            options["password"] = settings.nats_password or ""
        if settings.nats_tls_ca or any(u.startswith("tls://") for u in servers):
            import ssl

            ctx = ssl.create_default_context(
                cafile=str(settings.nats_tls_ca) if settings.nats_tls_ca else None
            )
            options["tls"] = ctx
        nc = _Client()
        try:
            await nc.connect(**options)
        except Exception as exc:
            raise BusError(f"cannot connect to NATS at {url}: {exc!r}") from exc
        nc.options["max_reconnect_attempts"] = -1
        return cls(nc, **kw)

    async def close(self) -> None:
        """Drain (stop subscriptions, flush what is buffered) for at most `close_timeout`,
        then close. A handler still busy by then is cancelled with the connection; what it
        had not acked is redelivered (publishes were confirmed when they returned)."""
        if self.nc.is_closed:
            return
        bound = self.close_timeout
        self.nc.options["drain_timeout"] = bound  # nats-py's own wait for subscriptions
        try:
            # The backstop: drain's flush and the publisher's close have bounds of their own
            # (10 s, the PubAck timeout) that a server not answering would use up.
            async with asyncio.timeout(bound + 1.0):
                if self._publisher is not None:
                    await self._publisher.close()
                await self.nc.drain()
        except TimeoutError:
            log.warning("bus: drain did not finish within %.1f s; closing", bound + 1.0)
        except Exception as exc:  # a connection that is reconnecting cannot drain
            log.debug("bus: drain failed (%r); closing", exc)
        finally:
            if not self.nc.is_closed:
                with contextlib.suppress(Exception):
                    await self.nc.close()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- streams ----------------------------------------------------------------------
    async def ensure_streams(
        self, specs: Iterable[StreamSpec] = STREAMS, replicas: int | None = None
    ) -> None:
        """Create the streams, or update their limits when they changed (idempotent).

        `replicas` defaults to the bus's `stream_replicas` (AGENTRL_STREAM_REPLICAS: 1 for
        the embedded server, 3 on a production cluster)."""
        replicas = replicas or self.stream_replicas
        for spec in specs:
            config = StreamConfig(
                name=spec.name,
                subjects=list(spec.subjects),
                max_age=float(spec.max_age_s),
                max_msgs=spec.max_msgs,
                max_bytes=spec.max_bytes,
                storage=StorageType(spec.storage),
                duplicate_window=float(spec.duplicate_window_s),
                num_replicas=replicas,
            )
            info = await self._retry(partial(_stream_info_or_none, name=spec.name))
            if info is None:
                try:
                    await self._retry(partial(JetStreamContext.add_stream, config=config))
                except nats.js.errors.APIError as exc:
                    if exc.err_code == 10074:
                        raise BusError(
                            f"stream replicas {replicas} need a NATS cluster, but the server "
                            "is a single server: set AGENTRL_STREAM_REPLICAS=1, or run a "
                            "cluster (`agentrl up --cluster 3`)"
                        ) from exc
                    raise
                log.debug("created stream %s", spec.name)
                continue
            current = info.config
            if (
                sorted(current.subjects or []) != sorted(config.subjects or [])
                or current.max_age != config.max_age
                or current.max_msgs != config.max_msgs
                or current.max_bytes != config.max_bytes
                or current.duplicate_window != config.duplicate_window
                or (current.num_replicas or 1) != replicas
            ):
                await self._retry(partial(JetStreamContext.update_stream, config=config))
                log.debug("updated stream %s", spec.name)

    async def _retry(self, call: Callable[[JetStreamContext], Awaitable[Any]]) -> Any:
        """`call(js)`, a JetStream API call, retried on timeouts and on a cluster electing a
        leader (a busy, restarting or failing-over server).

        Each try gives up sooner than the bus's timeout (`kv.sooner`: 1 s, doubling up to
        it): a request sent while the cluster elects its meta leader is never answered, and
        a whole timeout per lost request held `ensure_streams` that long past the cluster's
        return. A try cut short counts as its share of one of `api_attempts`, so lost
        requests are still waited for as long in all as before. A re-sent create or update
        is safe: JetStream answers an identical stream or consumer config as a success."""
        used = 0.0
        for tries in itertools.count(1):
            timeout = min(FIRST_TRY_S * 2 ** (tries - 1), self.publish_timeout)
            try:
                return await call(sooner(self.js, timeout))
            except _API_RETRYABLE as exc:
                # 10005 "no suitable peers for placement": a cluster still forming, or a
                # node restarting, has too few peers for the replicas for a moment.
                if isinstance(exc, nats.js.errors.APIError) and not (
                    isinstance(exc, nats.js.errors.ServiceUnavailableError) or exc.err_code == 10005
                ):
                    raise
                timed_out = isinstance(exc, TimeoutError)
                used += timeout / self.publish_timeout if timed_out else 1.0
                task = asyncio.current_task()
                # a cancellation that reached a request as its timeout (asyncio.wait_for on
                # Python 3.11) must stop here, not be asked again
                if used >= self.api_attempts or (task is not None and task.cancelling()):
                    raise
                await asyncio.sleep(min(0.2 * 2 ** (tries - 1), 2.0))
        raise AssertionError("unreachable")

    # ---- publishing -------------------------------------------------------------------
    def encode(
        self, event: Event | dict[str, Any], subject: str | None = None
    ) -> tuple[str, bytes, str]:
        """Validate and serialise: returns (subject, bytes, msg_id)."""
        if isinstance(event, dict):
            if subject is None:
                raise BusError("publishing a dict needs its subject")
            model = model_for(subject)
            if model is None:
                raise BusError(f"no contract for subject {subject!r}; use publish_json")
            event = model.model_validate(event)
        subject = subject or event.SUBJECT
        return subject, event.to_json(), event.msg_id()

    async def publish(self, event: Event | dict[str, Any], subject: str | None = None) -> PubAck:
        subject, data, msg_id = self.encode(event, subject)
        ack = await self.publish_raw(subject, data, msg_id)
        if INSTRUMENTED:
            obs.bus_published(subject)
        return ack

    async def publish_json(self, subject: str, payload: dict[str, Any], msg_id: str) -> PubAck:
        """Publish a JSON object; validated when the subject has a contract."""
        model = model_for(subject)
        data = (
            model.model_validate(payload).to_json()
            if model is not None
            else json.dumps(payload, default=str).encode()
        )
        return await self.publish_raw(subject, data, msg_id)

    def _check_size(self, subject: str, data: bytes) -> None:
        limit = self.nc.max_payload
        if limit and len(data) > limit:
            raise PayloadTooLargeError(
                f"message for {subject} is {len(data):,} bytes, over the server's max_payload of "
                f"{limit:,} bytes: shorten it (e.g. truncate tool outputs) or raise max_payload"
            )

    async def publish_raw(
        self, subject: str, data: bytes, msg_id: str, headers: dict[str, str] | None = None
    ) -> PubAck:
        """Publish bytes with `Nats-Msg-Id`, await the PubAck, retry timeouts with backoff."""
        self._check_size(subject, data)
        hdrs = {"Nats-Msg-Id": msg_id, **(headers or {})}
        delay = 0.05
        last: Exception | None = None
        for _attempt in range(self.publish_retries + 1):
            try:
                return await self.js.publish(
                    subject, data, timeout=self.publish_timeout, headers=hdrs
                )
            except _RETRYABLE as exc:
                last = exc
                if self.nc.is_closed:
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except nats.js.errors.APIError as exc:
                # 503: the stream has no leader yet (a cluster is electing one).
                if exc.code != 503:
                    raise
                last = exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        raise BusError(
            f"publish to {subject} (id {msg_id}) failed after {self.publish_retries + 1} "
            f"attempts: {last!r}; is the NATS server up and does a stream capture the subject?"
        )

    async def publish_many(self, events: Iterable[Event | tuple[str, bytes, str]]) -> list[PubAck]:
        """Publish many events with pipelined publishing; returns their PubAcks in order.

        Events that are pydantic contract objects were validated when they were built and are
        only serialised here; `(subject, bytes, msg_id)` tuples are sent as they are. Up to
        `async_window` messages are in flight. Messages that get no PubAck (a timeout, no
        responders while a cluster elects a stream leader, a reconnect) are published again
        under the same `Nats-Msg-Id`, so a retry never stores a second copy; the call returns
        only when every message is stored, and raises `BusError` when one cannot be.
        """
        with _gc_paused():
            if self._publisher is None:
                items = [e if isinstance(e, tuple) else self.encode(e) for e in events]
                for subject, data, _ in items:
                    self._check_size(subject, data)
                return await self._publish_many_public(items)
            pending = list(events)
            encoded: list[tuple[str, bytes, str]] = []
            limit = self.nc.max_payload

            def first_time(i: int) -> tuple[str, bytes, str]:
                # Serialised chunk by chunk while earlier chunks are stored (in order: the
                # publisher asks for 0, 1, 2, ...). `encode` inlined: this runs per message.
                e = pending[i]
                t = e if isinstance(e, tuple) else (e.SUBJECT, e.to_json(), e.msg_id())
                if limit and len(t[1]) > limit:
                    self._check_size(t[0], t[1])
                encoded.append(t)
                return t

            results: list[PubAck | BaseException | None] = [None] * len(pending)
            todo = list(range(len(pending)))
            delay = 0.05
            for round_ in range(self.publish_retries + 1):
                if self.nc.is_closed:
                    break
                get = first_time if round_ == 0 else partial(_pick, encoded, todo)
                try:
                    got = await self._publisher.publish(len(todo), get, timeout=self.stall_timeout)
                except _RETRYABLE as exc:
                    got = [exc] * len(todo)
                if len(encoded) < len(pending):  # the first round broke off: encode the rest
                    for i in range(len(encoded), len(pending)):
                        first_time(i)
                for i, res in zip(todo, got, strict=True):
                    results[i] = res
                failed = [i for i in todo if not isinstance(results[i], PubAck)]
                if not failed:
                    break
                hard = [
                    results[i]
                    for i in failed
                    if isinstance(results[i], wire.PubAckError) and results[i].code != 503  # type: ignore[union-attr]
                ]
                if hard:
                    raise BusError(f"publish rejected by the server: {hard[0]}")
                log.info(
                    "%d of %d publishes unconfirmed (%r); retrying under the same ids",
                    len(failed),
                    len(pending),
                    results[failed[0]],
                )
                todo = failed
                if INSTRUMENTED:
                    self.counters["publish_retried"] += len(failed)
                # A short cap: a new stream leader takes publishes as soon as it is elected.
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
            items = encoded
        acks: list[PubAck] = []
        for (subject, data, msg_id), res in zip(items, results, strict=True):
            # Whatever is still unconfirmed goes through the one-by-one path (raises BusError).
            acks.append(
                res if isinstance(res, PubAck) else await self.publish_raw(subject, data, msg_id)
            )
        if INSTRUMENTED:
            self.counters["published"] += len(acks)
            obs.bus_published_many(items)
        return acks

    async def _publish_many_public(self, items: list[tuple[str, bytes, str]]) -> list[PubAck]:
        """nats-py's own publish_async (used when the wire fast path is unavailable)."""
        futures: list[asyncio.Future[PubAck]] = []
        for subject, data, msg_id in items:
            futures.append(
                await self.js.publish_async(subject, data, headers={"Nats-Msg-Id": msg_id})
            )
        if futures:
            await asyncio.wait(futures, timeout=self.publish_timeout)
        acks: list[PubAck] = []
        for (subject, data, msg_id), fut in zip(items, futures, strict=True):
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                acks.append(fut.result())
            else:
                acks.append(await self.publish_raw(subject, data, msg_id))
        return acks

    # ---- consuming --------------------------------------------------------------------
    async def consume(
        self,
        subject: str,
        durable: str,
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        batch: int = 256,
        max_deliver: int = 5,
        ack_wait: float = 30.0,
        nak_delay: float = 1.0,
        fetch_timeout: float = 0.5,
        stop: asyncio.Event | None = None,
        validate: bool = True,
        stats: ConsumeStats | None = None,
    ) -> ConsumeStats:
        """Run a durable pull consumer on `subject` until `stop` is set (or the task is
        cancelled); returns counts. Exactly one of `handler` / `batch_handler` is given.

        Each message is validated against its contract; the handler gets the event. A
        failure after `max_deliver` deliveries, a `PermanentError` or a payload that fails
        validation is dead-lettered to RL_DLQ with the reason, then terminated.

        Every batch's acks are confirmed by the server before the next batch's acks are
        sent, and before this returns: after a clean stop nothing handled is redelivered.
        The confirmation of one batch travels while the next is handled (pipelined: a round
        trip per batch no longer stalls the consumer). Up to two batches are requested
        ahead; messages already requested when `stop` is set are still handled (within
        about `fetch_timeout`), so none is left pending.
        """
        if (handler is None) == (batch_handler is None):
            raise BusError("give exactly one of handler or batch_handler")
        stop = stop or asyncio.Event()
        stats = stats or ConsumeStats()
        spec = stream_for(subject)
        config = _consumer_config(subject, durable, batch, ack_wait)
        model = model_for(subject) if validate else None
        confirming: list[asyncio.Task[None]] = []  # the previous batch's ack confirmation
        confirmer = wire.AckConfirmer(self.nc) if self._fast else None
        waiting: list[_Waiting] = []  # the batch whose `Deferred` outcomes are not in yet
        finish = partial(
            self._finish,
            durable=durable,
            max_deliver=max_deliver,
            nak_delay=nak_delay,
            stats=stats,
            confirming=confirming,
            confirmer=confirmer,
        )
        process = partial(
            self._process,
            model=model,
            handler=handler,
            batch_handler=batch_handler,
            durable=durable,
            max_deliver=max_deliver,
            ack_wait=ack_wait,
            stats=stats,
            waiting=waiting,
            finish=finish,
        )
        settle = partial(self._settle_waiting, waiting, finish)
        batches = _Batches(process, settle, waiting, confirming, confirmer)
        if not self._fast:
            try:
                return await self._consume_public(
                    subject,
                    durable,
                    spec.name,
                    config,
                    batch,
                    fetch_timeout,
                    stop,
                    stats,
                    process,
                    settle,
                )
            finally:
                await batches.close()
        await self._consume_fast(
            spec.name, durable, config, batch, fetch_timeout, stop, stats, batches
        )
        return stats

    async def _consume_fast(
        self,
        stream: str,
        durable: str,
        config: ConsumerConfig,
        batch: int,
        fetch_timeout: float,
        stop: asyncio.Event,
        stats: ConsumeStats,
        batches: _Batches,
    ) -> None:
        """The pull loop on the wire fast path (`wire.PullFeed`: up to two batches
        requested ahead). Once `stop` is set, what was already requested is still handled;
        the last batches are settled and confirmed before the inbox is dropped."""
        process = batches.process
        await self._retry(partial(_ensure_consumer, stream=stream, durable=durable, config=config))
        sub = await wire.subscribe(self.nc, self.nc.new_inbox())
        prefix = getattr(self.js, "_prefix", "$JS.API")
        feed = wire.PullFeed(
            self.nc, sub, f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}", batch, fetch_timeout
        )
        task = asyncio.current_task()
        try:
            while True:
                _raise_lost_cancel(task)
                if stop.is_set():
                    if feed.settled:
                        break
                elif not await _topped_up(feed):
                    await asyncio.sleep(0.2)
                    continue
                msgs = await _next_batch(feed, batch, batches)
                if not msgs:
                    await feed.wait(fetch_timeout / 2 if stop.is_set() else fetch_timeout)
                    continue
                stats.batches += 1
                stats.received += len(msgs)
                with _gc_paused():
                    await process(msgs)
        finally:
            await batches.close()
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _consume_public(
        self,
        subject: str,
        durable: str,
        stream: str,
        config: ConsumerConfig,
        batch: int,
        fetch_timeout: float,
        stop: asyncio.Event,
        stats: ConsumeStats,
        process: Callable[[list[Msg]], Awaitable[None]],
        settle: Callable[[], Awaitable[None]],
    ) -> ConsumeStats:
        """nats-py's own fetch loop (used when the wire fast path is unavailable)."""
        sub = await self.js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
        task = asyncio.current_task()
        try:
            while not stop.is_set():
                _raise_lost_cancel(task)
                try:
                    msgs = await sub.fetch(batch, timeout=fetch_timeout)
                except (TimeoutError, nats.errors.TimeoutError):
                    await settle()  # an idle stream: the deferred batch waits no longer
                    continue
                except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
                    await asyncio.sleep(0.2)
                    continue
                stats.batches += 1
                stats.received += len(msgs)
                with _gc_paused():
                    await process(msgs)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return stats

    async def _process(
        self,
        msgs: list[Msg],
        *,
        model: type[BaseModel] | None,
        handler: Handler | None,
        batch_handler: BatchHandler | None,
        durable: str,
        max_deliver: int,
        ack_wait: float,
        stats: ConsumeStats,
        waiting: list[_Waiting],
        finish: Callable[[list[Delivery], Outcomes, list[tuple[str, bytes]]], Awaitable[None]],
    ) -> None:
        """Validate a batch, hand it to the handler, then settle the batch still waiting
        for `Deferred` outcomes (if any), and this one unless it is deferred in turn."""
        acks: list[tuple[str, bytes]] = []
        good: list[Delivery] = []
        for msg in msgs:
            delivered = _num_delivered(msg)
            if delivered > max_deliver:
                await self._dead_letter(
                    msg,
                    durable,
                    f"exceeded max_deliver={max_deliver} without success",
                    "max_deliver",
                    stats,
                )
                acks.append((msg.reply, wire.TERM))
                continue
            if model is None:
                good.append(Delivery(msg, msg.data))
                continue
            try:
                good.append(Delivery(msg, model.model_validate_json(msg.data)))
            except ValidationError as exc:
                await self._dead_letter(msg, durable, _validation_reason(exc), "validation", stats)
                acks.append((msg.reply, wire.TERM))
        if not good:
            await self._settle_waiting(waiting, finish)
            await finish([], None, acks)
            return
        heartbeat = asyncio.create_task(_keep_alive(good, ack_wait))
        try:
            result = await self._run_handlers(good, handler, batch_handler)
        except BaseException:
            heartbeat.cancel()
            raise
        if isinstance(result, Deferred):
            try:
                await self._settle_waiting(waiting, finish)
            finally:  # even when cancelled meanwhile: `consume` settles what waits
                waiting.append(_Waiting(good, acks, result, heartbeat))
            return
        heartbeat.cancel()
        await self._settle_waiting(waiting, finish)
        await finish(good, result, acks)

    async def _settle_waiting(
        self,
        waiting: list[_Waiting],
        finish: Callable[[list[Delivery], Outcomes, list[tuple[str, bytes]]], Awaitable[None]],
    ) -> None:
        """Wait for the deferred batch's outcomes, then ack/nak/dead-letter it."""
        while waiting:
            w = waiting.pop(0)
            fut = w.deferred.outcomes
            try:
                await asyncio.wait([fut])
            finally:
                w.heartbeat.cancel()
            outcomes: Outcomes
            if fut.cancelled():
                outcomes = [BusError("the deferred batch was cancelled")] * len(w.good)
            elif (exc := fut.exception()) is not None:
                log.warning("deferred batch failed: %s", exc, exc_info=exc)
                outcomes = [exc] * len(w.good)
            else:
                outcomes = fut.result()
            await finish(w.good, outcomes, w.acks)

    async def _finish(
        self,
        good: list[Delivery],
        outcomes: Outcomes,
        acks: list[tuple[str, bytes]],
        *,
        durable: str,
        max_deliver: int,
        nak_delay: float,
        stats: ConsumeStats,
        confirming: list[asyncio.Task[None]],
        confirmer: wire.AckConfirmer | None,
    ) -> None:
        """Turn a batch's outcomes into acks, naks and dead letters, and send them."""
        if outcomes is None:
            outcomes = [None] * len(good)
        elif len(outcomes) != len(good):
            raise BusError("batch handler returned a different number of outcomes")
        nak_body = wire.nak(nak_delay)
        for delivery, outcome in zip(good, outcomes, strict=True):
            if outcome is None:
                acks.append((delivery.msg.reply, wire.ACK))
                stats.acked += 1
            elif isinstance(outcome, PermanentError) or delivery.num_delivered >= max_deliver:
                reason = f"{type(outcome).__name__}: {outcome}"
                await self._dead_letter(delivery.msg, durable, reason, "handler", stats)
                acks.append((delivery.msg.reply, wire.TERM))
                stats.errors.append(reason)
            else:
                acks.append((delivery.msg.reply, nak_body))
                stats.nakked += 1
                stats.errors.append(f"{type(outcome).__name__}: {outcome}")
        if INSTRUMENTED and acks:
            obs.bus_consumed(durable, sum(1 for _, body in acks if body is wire.ACK))
        # The previous batch's acks are confirmed before this batch's go out (one
        # confirmation in flight); this batch's acks are written now and their confirmation
        # travels while the next batch is handled; `consume` awaits the last one.
        await _confirmed(confirming)
        if not acks:
            return
        if confirmer is None:
            await self._settle(acks, stats)
            return
        try:
            token = await confirmer.send(acks)
        except (
            nats.errors.ConnectionClosedError,
            nats.errors.ConnectionReconnectingError,
            nats.errors.OutboundBufferLimitError,
        ) as exc:
            log.warning("acks of a batch of %d not sent: %r", len(acks), exc)
            self._count_settled(acks, stats, confirmed=False)
            return
        confirming.append(asyncio.ensure_future(self._confirm(confirmer, token, acks, stats)))

    async def _confirm(
        self,
        confirmer: wire.AckConfirmer,
        token: bytes,
        acks: list[tuple[str, bytes]],
        stats: ConsumeStats,
    ) -> None:
        confirmed = await confirmer.confirmed(token, self.ack_confirm_timeout)
        if not confirmed:
            log.warning("acks of a batch of %d not confirmed", len(acks))
        self._count_settled(acks, stats, confirmed)

    async def _settle(self, acks: list[tuple[str, bytes]], stats: ConsumeStats) -> None:
        """Send a batch's acks, naks and terms, and wait for the server to confirm them
        (nats-py's public API: the fallback when the wire fast path is unavailable)."""
        if not acks:
            return
        confirmed = True
        for reply, body in acks[:-1]:
            await self.nc.publish(reply, body)
        try:
            await self.nc.request(acks[-1][0], acks[-1][1], timeout=self.ack_confirm_timeout)
        except Exception as exc:
            log.warning("acks of a batch not confirmed: %r", exc)
            confirmed = False
        self._count_settled(acks, stats, confirmed)

    def _count_settled(
        self, acks: list[tuple[str, bytes]], stats: ConsumeStats, confirmed: bool
    ) -> None:
        if confirmed:
            stats.confirmed_at = time.monotonic()
        else:
            stats.unconfirmed_batches += 1
        if INSTRUMENTED:
            c = self.counters
            c["consumed"] += len(acks)
            c["acked"] += sum(1 for _, body in acks if body is wire.ACK)
            if not confirmed:
                c["acks_unconfirmed"] += len(acks)

    async def _run_handlers(
        self,
        deliveries: list[Delivery],
        handler: Handler | None,
        batch_handler: BatchHandler | None,
    ) -> Outcomes | Deferred:
        if batch_handler is not None:
            try:
                return await batch_handler(deliveries)
            except TransientError as exc:  # asked to come back later: no fault, no traceback
                log.info("batch handler deferred %d messages: %s", len(deliveries), exc)
                return [exc] * len(deliveries)
            except Exception as exc:  # the whole batch failed: each message fails with it
                log.warning("batch handler failed: %s", exc, exc_info=True)
                return [exc] * len(deliveries)
        assert handler is not None
        outcomes: list[BaseException | None] = []
        for delivery in deliveries:
            token = _current.set(delivery)
            try:
                await handler(delivery.event)
                outcomes.append(None)
            except TransientError as exc:
                log.info("handler deferred a message on %s: %s", delivery.subject, exc)
                outcomes.append(exc)
            except Exception as exc:
                log.warning("handler failed on %s: %s", delivery.subject, exc, exc_info=True)
                outcomes.append(exc)
            finally:
                _current.reset(token)
        return outcomes

    async def _dead_letter(
        self, msg: Msg, consumer: str, reason: str, kind: str, stats: ConsumeStats
    ) -> None:
        """Store the message in RL_DLQ with why it failed (the caller then terminates it).

        The record carries the original bytes, or a reference to them (stream, sequence and
        an excerpt) when they do not fit in one message. Transient failures are retried by
        `publish_raw`; if even the reference cannot be stored, the failure is logged with
        the original's stream and sequence and counted, and the message is still terminated:
        a dead letter must never stop the consumer.
        """
        meta = msg.metadata
        stats.dead_lettered += 1
        if INSTRUMENTED:
            self.counters["dead_lettered"] += 1
            obs.bus_dead_letter(msg.subject)
        common: dict[str, Any] = {
            "subject": msg.subject,
            "stream": meta.stream,
            "stream_seq": meta.sequence.stream,
            "consumer": consumer,
            "delivery_count": meta.num_delivered,
            "kind": kind,
            "reason": reason,
            "at": utcnow().isoformat(),
            "headers": dict(msg.headers or {}),
            "data": msg.data,
        }
        subject = f"{DLQ_PREFIX}.{msg.subject}"
        msg_id = f"dlq:{meta.stream}:{meta.sequence.stream}:{consumer}"
        record = deadletter.build_record(**common, max_bytes=self.nc.max_payload)
        try:
            await self.publish_raw(subject, record, msg_id)
        except (BusError, nats.errors.Error) as exc:
            log.warning(
                "dead letter for %s seq %s failed (%r); storing it by reference",
                meta.stream,
                meta.sequence.stream,
                exc,
            )
            try:
                await self.publish_raw(
                    subject,
                    deadletter.by_reference(
                        json.loads(deadletter.build_record(**common, max_bytes=0)),
                        msg.data,
                        max(self.nc.max_payload - deadletter.HEADROOM_BYTES, 1024),
                    ),
                    msg_id,
                )
            except (BusError, nats.errors.Error) as exc2:
                stats.dlq_failures += 1
                if INSTRUMENTED:
                    self.counters["dlq_failures"] += 1
                log.error(
                    "could not dead-letter %s seq %s (%s: %s): %r; terminating it anyway, "
                    "the original stays in the stream for its retention",
                    meta.stream,
                    meta.sequence.stream,
                    kind,
                    reason,
                    exc2,
                )
                return
        log.warning(
            "dead-lettered %s seq %s: %s",
            msg.subject,
            meta.sequence.stream,
            reason,
            extra={"subject": msg.subject},
        )

    async def dead_letters(self, limit: int = 1000, timeout: float = 1.0) -> list[dict[str, Any]]:
        """Read RL_DLQ records (without consuming them), oldest first."""
        out: list[dict[str, Any]] = []
        try:
            info = await self.js.stream_info("RL_DLQ")
        except nats.js.errors.NotFoundError:
            return out
        if not info.state.messages:  # a fresh stream: first_seq 0 is no message to read
            return out
        first, last = info.state.first_seq, info.state.last_seq
        for seq in range(first, min(last, first + limit - 1) + 1):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                raw = await self.js.get_msg("RL_DLQ", seq)
                out.append(json.loads(raw.data or b"{}"))
        return out


class _Client(NATS):
    """nats-py's client, except that a request never loses its task's cancellation (see
    `_raise_lost_cancel`): every JetStream and KV call is a request, so a service cancelled
    while it opens a bucket, creates a consumer or reads a key stops there."""

    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,
        old_style: bool = False,
        headers: dict[str, Any] | None = None,
    ) -> Msg:
        task = asyncio.current_task()
        asked = task.cancelling() if task is not None else 0
        msg = await super().request(subject, payload, timeout, old_style, headers)
        if task is not None and task.cancelling() > asked:
            raise asyncio.CancelledError  # the answer landed with the cancel: 3.11 kept it
        return msg


def _consumer_config(subject: str, durable: str, batch: int, ack_wait: float) -> ConsumerConfig:
    """The durable pull consumer of `consume`. The server redelivers without limit; the
    delivery count is enforced by the bus, so a consumer that crashed on the last allowed
    delivery cannot make a message vanish."""
    return ConsumerConfig(
        durable_name=durable,
        ack_wait=ack_wait,
        max_deliver=-1,
        max_ack_pending=max(batch * 4, 1000),
        filter_subject=subject,
    )


async def _topped_up(feed: wire.PullFeed) -> bool:
    """Pull requests topped up; False while the connection is away (closed, reconnecting
    or its buffer full): the caller waits a moment and tries again."""
    try:
        await feed.top_up()
    except (
        nats.errors.ConnectionClosedError,
        nats.errors.ConnectionReconnectingError,
        nats.errors.OutboundBufferLimitError,
    ):
        return False
    return True


async def _next_batch(feed: wire.PullFeed, batch: int, batches: _Batches) -> list[Any]:
    """Up to `batch` messages. While a deferred batch commits, the next batch is read in
    meanwhile, then the deferred one settled if it is done (its acks go out sooner)."""
    msgs = feed.take(batch)
    waiting = batches.waiting
    if waiting and len(msgs) < batch:
        await feed.fill(batch - len(msgs), waiting[0].deferred.outcomes)
        if waiting[0].deferred.outcomes.done():
            await batches.settle()
        msgs += feed.take(batch - len(msgs))
    return msgs


def _raise_lost_cancel(task: asyncio.Task[Any] | None) -> None:
    """Raise the cancellation a consumer was asked for but never got.

    On Python 3.11 `asyncio.wait_for` (in nats-py's every request, and in the pull feed's wait)
    returns the result instead of raising when the answer lands in the same loop turn as the
    cancel: the cancel is gone and the consumer ran on until its stop event. A reward
    service's TaskGroup, whose other consumer had failed, waited for it forever (a rewards
    test hung 300 s in the suite). `cancelling()` still counts the request."""
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _confirmed(confirming: list[asyncio.Task[None]]) -> None:
    """Wait for the ack confirmation in flight, if any (it logs and counts its own failure;
    a cancelled consumer cancels it too, and those messages are simply redelivered)."""
    while confirming:
        task = confirming.pop()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch is encoded and published, or
    validated and handled.

    Validating or publishing a batch allocates thousands of small objects while the whole
    batch stays alive, so the collector rescans it again and again: measured, that halves
    consume and publish throughput. Collection resumes right after the batch (reference counting still frees
    everything acyclic at once).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def _log_connection_error(exc: Exception) -> None:
    if isinstance(exc, nats.errors.DrainTimeoutError):  # `Bus.close()`'s bound, used up
        log.warning("bus: a subscription's handler was still busy at close; cut at the bound")
        return
    log.debug("NATS connection error: %r", exc)


async def _keep_alive(deliveries: list[Delivery], ack_wait: float) -> None:
    """While handlers run longer than the ack timer, keep telling the server they work."""
    period = max(ack_wait / 3, 0.1)
    start = time.monotonic()
    while True:
        await asyncio.sleep(period)
        log.debug("batch still running after %.1fs: in_progress", time.monotonic() - start)
        for d in deliveries:
            with contextlib.suppress(Exception):
                await d.in_progress()


def _pick(items: list[tuple[str, bytes, str]], which: list[int], j: int) -> tuple[str, bytes, str]:
    return items[which[j]]


def _num_delivered(msg: Msg) -> int:
    """The delivery count from the `$JS.ACK` reply subject, without building nats-py's
    whole Metadata object (a measurable share of a message's consume cost)."""
    tokens = msg.reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        return int(tokens[4])
    if len(tokens) >= 11:  # $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>...
        return int(tokens[6])
    return int(msg.metadata.num_delivered or 1)


def _validation_reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err["loc"]) or "<payload>"
        parts.append(f"{loc}: {err['msg']}")
    return "payload failed validation: " + "; ".join(parts)


async def _stream_info_or_none(js: JetStreamContext, name: str) -> Any:
    try:
        return await js.stream_info(name)
    except nats.js.errors.NotFoundError:
        return None


async def _ensure_consumer(
    js: JetStreamContext, stream: str, durable: str, config: ConsumerConfig
) -> None:
    try:
        await js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        await js.add_consumer(stream, config=config)
