"""Wire-level fast paths over nats-py: pipelined publishing, a pull feed, batched acks.

nats-py spends most of a message's time in per-message machinery: `publish_async` makes a
future, waits on a semaphore with `wait_for` and validates headers with a regex for every
message; `fetch` awaits every message of a batch separately; `Msg.ack` is one publish call
each. Profiled (BENCHMARKS.md), that overhead was larger than JSON validation itself. Here
a whole chunk of publishes or acks is written to the connection's buffer in one call, and
delivered messages are drained from the subscription's queue without an await per message.

These helpers use three nats-py internals (`Client._send_command`, `Client._flush_pending`,
`Subscription._pending_queue`/`_pending_size`); `supported()` checks them once, and the
`Bus` falls back to nats-py's public API when they are missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import nats.errors
import orjson
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import PubAck

log = logging.getLogger(__name__)

ACK = b"+ACK"
TERM = b"+TERM"
_HDR_PREFIX = b"NATS/1.0\r\nNats-Msg-Id: "
_HDR_SUFFIX = b"\r\n\r\n"


def supported(nc: NATS) -> bool:
    """Whether this nats-py still has the internals the fast paths write through."""
    return all(
        hasattr(nc, a)
        for a in ("_send_command", "_flush_pending", "_nuid", "_process_msg", "_subs", "msg_class")
    )


Sink = Callable[[bytes, bytes, "bytes | None"], None]


async def subscribe(nc: NATS, subject: str, sink: Sink | None = None) -> Subscription:
    """A plain subscription (no callback, no pending limits) whose messages skip nats-py's
    generic per-message dispatch: no coroutine per header block, headers split in one pass,
    the message queued directly. Used for the pull feed and ack confirmations; anything
    else (status lines, other subscriptions) takes nats-py's own path.

    With `sink`, no `Msg` is made at all: every message of the subscription, status lines
    included, is handed over as `sink(subject, data, raw_header_block)`. The publisher's
    PubAcks take this path: one arrives per published message, and the publisher needs
    only its token and bytes, not a Msg object and a queue round trip."""
    sub = await nc.subscribe(subject, pending_msgs_limit=0, pending_bytes_limit=0)
    _fast_sids(nc)[sub._id] = sink
    return sub


def _fast_sids(nc: NATS) -> dict[int, Sink | None]:
    fast: dict[int, Sink | None] | None = getattr(nc, "_agentrl_fast_sids", None)
    if fast is not None:
        return fast
    fast = {}
    original = nc._process_msg
    subs = nc._subs
    stats = nc.stats
    msg_class = nc.msg_class

    async def process_msg(
        sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        if sid in fast:
            sink = fast[sid]
            if sink is not None:
                stats["in_msgs"] += 1
                stats["in_bytes"] += len(data)
                sink(subject, data, headers)
                return
            sub = subs.get(sid)
            if sub is not None and not (headers and headers[8:10] != b"\r\n"):  # no status
                stats["in_msgs"] += 1
                stats["in_bytes"] += len(data)
                sub._received += 1
                msg = msg_class(
                    subject=subject.decode(),
                    reply=reply.decode(),
                    data=data,
                    headers=_header_lines(headers) if headers else None,
                    _client=nc,
                    _sid=sid,
                )
                sub._pending_size += len(data)
                sub._pending_queue.put_nowait(msg)
                return
        await original(sid, subject, reply, data, headers)  # type: ignore[arg-type]

    nc._process_msg = process_msg  # type: ignore[method-assign]
    nc._agentrl_fast_sids = fast  # type: ignore[attr-defined]
    return fast


def _header_lines(block: bytes) -> dict[str, str] | None:
    """nats-py's `_parse_header_lines` for a header block without a status line."""
    out: dict[str, str] = {}
    for line in block[10:].split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if key != "".join(key.split()):
            continue  # whitespace inside a header name: not a header
        out[key] = value.strip().decode("utf-8", "replace")
    return out or None


def nak(delay_s: float) -> bytes:
    return b'-NAK {"delay": %d}' % int(delay_s * 1e9)


def hpub(subject: bytes, reply: bytes, msg_id: str, data: bytes) -> bytes:
    """One HPUB protocol frame with a `Nats-Msg-Id` header (ids never contain CR/LF)."""
    hdr = _HDR_PREFIX + msg_id.encode() + _HDR_SUFFIX
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
        subject,
        reply,
        len(hdr),
        len(hdr) + len(data),
        hdr,
        data,
    )


async def write(nc: NATS, frames: list[bytes]) -> None:
    """Queue protocol frames on the connection in one buffer and wake its flusher."""
    if not frames:
        return
    if nc.is_closed:
        raise nats.errors.ConnectionClosedError
    await nc._send_command(b"".join(frames))
    await nc._flush_pending()


class AckConfirmer:
    """Sends a batch's acks at once and confirms them later.

    The server handles one consumer's acks in arrival order and answers an ack that carries
    a reply subject once it is processed (replicated, on a cluster), so when that answer
    arrives every earlier ack of the batch is applied too: the acks are confirmed, and a
    consumer restarted right after sees no redelivery.

    `send` writes every ack/nak/term of a batch in one buffer, the last one with a reply
    subject of this confirmer's own inbox, and returns without waiting; `confirmed` then
    waits for the server's answer to that last ack. Writing at once matters: the consumer
    goes on validating and handling the next batch without yielding to the event loop, so
    a confirmation that is only *started* in a task would travel no earlier than the next
    await. One confirmation is in flight at a time (the caller awaits it before sending the
    next batch's acks).
    """

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self._sub: Subscription | None = None
        self._prefix = b""
        self._serial = 0

    async def send(self, acks: Sequence[tuple[str, bytes]]) -> bytes:
        """Write the acks; returns the token `confirmed` waits for."""
        if self._sub is None:
            inbox = self.nc.new_inbox()
            self._prefix = inbox.encode() + b"."
            self._sub = await subscribe(self.nc, inbox + ".*")
        self._serial += 1
        token = b"%x" % self._serial
        *rest, (last_reply, last_body) = acks
        frames = [b"PUB %s %d\r\n%s\r\n" % (r.encode(), len(b), b) for r, b in rest]
        frames.append(
            b"PUB %s %s %d\r\n%s\r\n"
            % (last_reply.encode(), self._prefix + token, len(last_body), last_body)
        )
        await write(self.nc, frames)
        return token

    async def confirmed(self, token: bytes, timeout: float) -> bool:
        """Whether the server answered the ack sent with `token` within `timeout` (False on
        no responders: the consumer or its leader went away, and the batch is redelivered)."""
        assert self._sub is not None
        sub = self._sub
        queue: asyncio.Queue[Msg] = sub._pending_queue
        deadline = time.monotonic() + timeout
        want = self._prefix.decode() + token.decode()
        while True:
            remaining = deadline - time.monotonic()
            try:
                msg = (
                    queue.get_nowait()
                    if not queue.empty()
                    else await asyncio.wait_for(queue.get(), max(remaining, 0.0))
                )
            except TimeoutError:
                return False
            sub._pending_size -= len(msg.data)
            if msg.subject != want:
                continue  # the late answer of an earlier, timed-out batch
            status = (msg.headers or {}).get("Status")
            return status is None or status.startswith("2")

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


class PullFeed:
    """Keeps pull requests outstanding on a durable consumer and hands out what has arrived.

    Up to two batches are requested at a time, so the server delivers the next batch while
    the current one is handled. Credit accounting: each request adds its batch size; each
    delivered message takes one; a request's end status (408 with `Nats-Pending-Messages`)
    takes what it left unfilled. Requests lost with a server or a leader change are
    forgotten once their expiry (plus a grace period) has passed.
    """

    GRACE_S = 0.5

    def __init__(
        self, nc: NATS, sub: Subscription, next_subject: str, batch: int, expires: float
    ) -> None:
        self.nc = nc
        self.sub = sub
        self.queue: asyncio.Queue[Msg] = sub._pending_queue
        self.next_subject = next_subject
        self.batch = batch
        self.expires = expires
        self.credit = 0
        self.deadline = 0.0
        self._head: Msg | None = None
        self._request = b'{"batch":%d,"expires":%d}' % (batch, int(expires * 1e9))

    async def top_up(self) -> None:
        """Request another batch when less than one batch is outstanding."""
        now = time.monotonic()
        if self.credit > 0 and now > self.deadline:
            log.debug("pull requests expired without an answer (%d credit forgotten)", self.credit)
            self.credit = 0
        if self.credit < self.batch:
            await self.nc.publish(self.next_subject, self._request, reply=self.sub.subject)
            self.credit += self.batch
            self.deadline = now + self.expires + self.GRACE_S

    @property
    def settled(self) -> bool:
        """No request can still deliver: every one is filled, ended or expired."""
        return self.credit <= 0 or time.monotonic() > self.deadline

    def take(self, limit: int) -> list[Msg]:
        """Everything already received (up to `limit` messages), without awaiting."""
        out: list[Msg] = []
        if self._head is not None:
            msg, self._head = self._head, None
            self._account(msg, out)
        queue = self.queue
        while len(out) < limit and not queue.empty():
            self._account(queue.get_nowait(), out)
        return out

    def _account(self, msg: Msg, out: list[Msg]) -> None:
        self.sub._pending_size -= len(msg.data)
        if msg.reply:  # a stream message: its reply is the `$JS.ACK...` subject
            out.append(msg)
            self.credit -= 1
            return
        headers = msg.headers or {}
        status = headers.get("Status", "")
        if status in ("408", "409", "404"):
            pending = headers.get("Nats-Pending-Messages")
            if pending is not None:
                self.credit -= int(pending)
            elif status == "409":
                log.info("pull request ended: 409 %s", headers.get("Description", ""))
            self.credit = max(self.credit, 0)

    async def fill(self, n: int, done: asyncio.Future[Any], quiet_polls: int = 4) -> None:
        """Until `n` messages wait here, `done` completes, or the server pauses (nothing new
        for `quiet_polls` polls after something came: the stream holds less than `n`).
        Polled every half millisecond: in between, the read loop parses what the server
        sent while the caller was busy (a consumer that never yields otherwise finds
        nothing new when it looks)."""
        queue = self.queue
        seen, quiet = queue.qsize(), 0
        while queue.qsize() + (self._head is not None) < n and not done.done():
            await asyncio.wait([done], timeout=0.0005)
            size = queue.qsize()
            if size > seen:
                seen, quiet = size, 0
            elif size or self._head is not None:
                quiet += 1
                if quiet >= quiet_polls:
                    return

    async def wait(self, timeout: float) -> None:
        """Until something arrives or `timeout` passes."""
        if self._head is not None or not self.queue.empty():
            return
        with contextlib.suppress(TimeoutError):
            self._head = await asyncio.wait_for(self.queue.get(), timeout)


class AsyncPublisher:
    """Pipelined JetStream publishing with one reply subscription for every PubAck.

    Frames are written in chunks; PubAcks are matched to messages by the last token of the
    reply subject. At most `window` messages are unacknowledged at a time.
    """

    def __init__(self, nc: NATS, window: int) -> None:
        self.nc = nc
        self.window = max(window, 1)
        self._sub: Subscription | None = None
        self._prefix = b""
        self._lock = asyncio.Lock()
        self._serial = 0
        self._replies: deque[tuple[bytes, bytes, bytes | None]] = deque()
        self._arrived = asyncio.Event()

    def _take(self, subject: bytes, data: bytes, headers: bytes | None) -> None:
        self._replies.append((subject, data, headers))
        self._arrived.set()

    async def _ensure_sub(self) -> Subscription:
        if self._sub is None:
            inbox = self.nc.new_inbox()
            self._prefix = inbox.encode() + b"."
            self._sub = await subscribe(self.nc, inbox + ".*", sink=self._take)
        return self._sub

    async def publish(
        self,
        count: int,
        item: Callable[[int], tuple[str, bytes, str]],
        timeout: float,
        chunk: int = 256,
    ) -> list[PubAck | BaseException | None]:
        """Publish items 0..count-1 once; `item(i)` gives (subject, bytes, msg_id) and is
        called chunk by chunk, so serialising the next chunk overlaps with the server
        storing the previous one. Each result is its PubAck, the error the server answered,
        or None when no answer came within `timeout` of silence (the caller retries)."""
        async with self._lock:  # one batch at a time owns the replies
            await self._ensure_sub()
            replies = self._replies
            results: list[PubAck | BaseException | None] = [None] * count
            base = self._serial
            self._serial += count
            index: dict[bytes, int] = {}
            replies.clear()  # answers a timed-out earlier batch left behind
            outstanding = 0
            sent = 0
            prefix = self._prefix
            subjects: dict[str, bytes] = {}
            deadline = time.monotonic() + timeout
            while sent < count or outstanding:
                # Refill only when a whole chunk fits (or the tail does): writing one
                # message per returning PubAck means a syscall and a server read each.
                if sent < count and self.window - outstanding >= min(
                    chunk, count - sent, self.window
                ):
                    n = min(chunk, count - sent, self.window - outstanding)
                    frames = []
                    for i in range(sent, sent + n):
                        subject, data, msg_id = item(i)
                        token = b"%x" % (base + i)
                        index[token] = i
                        subj = subjects.get(subject)
                        if subj is None:
                            subj = subjects[subject] = subject.encode()
                        frames.append(hpub(subj, prefix + token, msg_id, data))
                    await write(self.nc, frames)
                    sent += n
                    outstanding += n
                    deadline = time.monotonic() + timeout
                    if (
                        self.window - outstanding >= min(chunk, count - sent, self.window)
                        and sent < count
                    ):
                        await asyncio.sleep(0)  # let the reader take in PubAcks meanwhile
                        outstanding -= self._drain(index, results)
                        continue
                got = self._drain(index, results)
                if got:
                    outstanding -= got
                    deadline = time.monotonic() + timeout
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except TimeoutError:
                    break
            return results

    def _drain(self, index: dict[bytes, int], results: list[PubAck | BaseException | None]) -> int:
        got = 0
        replies = self._replies
        while replies:
            subject, data, headers = replies.popleft()
            i = index.pop(subject.rsplit(b".", 1)[-1], None)
            if i is None:
                continue
            got += 1
            if not data:  # a status line, e.g. 503 no responders while a leader is elected
                status = headers[9:12] if headers else b""
                results[i] = nats.errors.NoRespondersError() if status == b"503" else None
                continue
            resp: dict[str, Any] = orjson.loads(data)
            if "error" in resp:
                results[i] = PubAckError(resp["error"])
            else:
                results[i] = PubAck(
                    stream=resp["stream"],
                    seq=resp["seq"],
                    domain=resp.get("domain"),
                    duplicate=resp.get("duplicate"),
                )
        return got

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


class PubAckError(Exception):
    """The server answered a publish with an error (e.g. no stream, leader not ready)."""

    def __init__(self, error: dict[str, Any]) -> None:
        self.code = int(error.get("code", 0))
        self.err_code = int(error.get("err_code", 0))
        self.description = str(error.get("description", ""))
        super().__init__(f"{self.code} {self.err_code}: {self.description}")
