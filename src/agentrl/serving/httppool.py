"""A small keep-alive HTTP/1.1 client for the gateway's hot path: POST a JSON body, read a
Content-Length or chunked answer, or a streamed one (server-sent events, parsed by httptools'
C parser) batch by batch. httpx costs about as much CPU per call as the rest of the gateway
together (connection-pool bookkeeping, anyio layers; its pool scans every connection per
request, so a streamed request cost ~9 ms of CPU at 200 requests/s), which decides the
gateway's added latency at high request rates; everything unusual (https, adapter loading)
still goes through httpx. TCP_NODELAY is set: a request is one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools


class HTTPError(Exception):
    """The connection failed or the answer was not HTTP/1.1 we understand."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class JsonPool:
    """Up to `size` idle keep-alive connections to one origin."""

    def __init__(
        self, base_url: str, headers: dict[str, str] | None = None, size: int = 128
    ) -> None:
        u = urlsplit(base_url)
        if u.scheme != "http":
            raise ValueError("JsonPool speaks plain http only")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.prefix = u.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f"Host: {self.host}:{self.port}\r\nContent-Type: application/json\r\n{extra}"
        self.idle: deque[_Conn] = deque()
        self.size = size

    async def _connect(self) -> _Conn:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Conn(reader, writer)

    def _reusable(self) -> _Conn | None:
        """The most recently used idle connection the server has not closed (its FIN has
        reached our reader: uvicorn closes keep-alive connections idle for 5 s), or None."""
        while self.idle:
            conn = self.idle.pop()
            if conn.reader.at_eof() or conn.writer.is_closing():
                conn.close()
                continue
            return conn
        return None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """(status, body). A reused connection that fails (the server closed it just now) is
        retried once on a new connection, never on another idle one (closed as well, likely)."""
        request = (
            f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        for attempt in (0, 1):
            idle = self._reusable() if attempt == 0 else None
            reused = idle is not None
            conn = idle if idle is not None else await self._connect()
            try:
                conn.writer.write(request)
                status, data, keep = await self._read(conn.reader)
            except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise HTTPError(f"{type(exc).__name__}: {exc}") from exc
            except BaseException:  # cancelled (a timeout): the connection is in an unknown state
                conn.close()
                raise
            if keep and len(self.idle) < self.size:
                self.idle.append(conn)
            else:
                conn.close()
            return status, data
        raise HTTPError("unreachable")

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length: int | None = None
        chunked = False
        keep = lines[0].startswith(b"HTTP/1.1")
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection":
                keep = b"close" not in value.lower()
        if chunked:
            parts = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # (no trailers expected)
                    break
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            return status, b"".join(parts), keep
        if length is None:
            return status, await reader.read(), False
        return status, await reader.readexactly(length), keep

    @contextlib.asynccontextmanager
    async def stream(self, path: str, body: bytes, timeout: float) -> AsyncIterator[EventStream]:
        """POST `body` and open the answer: `status` once its head is in (TimeoutError after
        `timeout` seconds), then its events. The connection goes back to the pool only when
        the answer was read to its end; one left early (a client gone, an error, a cancel) is
        closed. A reused connection that fails before its head is retried once on a new one,
        as `post` does."""
        request = (
            f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        deadline = asyncio.get_running_loop().time() + timeout
        for attempt in (0, 1):
            events = None
            idle = self._reusable() if attempt == 0 else None
            try:
                async with asyncio.timeout_at(deadline):
                    conn = idle if idle is not None else await self._connect()
                    events = EventStream(conn)
                    conn.writer.write(request)
                    await events.head()
            except TimeoutError:  # (an OSError too): no answer's head in time
                if events is not None:
                    conn.close()
                raise
            except (OSError, asyncio.IncompleteReadError, HTTPError) as exc:
                if events is not None:
                    conn.close()
                if idle is not None and events is not None and not events.got_bytes:
                    continue
                raise exc if isinstance(exc, HTTPError) else HTTPError(repr(exc)) from exc
            except BaseException:  # a cancel: the connection's state is unknown
                if events is not None:
                    conn.close()
                raise
            try:
                yield events
            except BaseException:
                conn.close()
                raise
            if events.done and events.keep and len(self.idle) < self.size:
                self.idle.append(conn)
            else:
                conn.close()
            return
        raise HTTPError("unreachable")

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class EventStream:
    """One streamed HTTP/1.1 answer on a connection: its status, then the `data:` payloads of
    its server-sent events, as lists of those complete in each read from the socket (one
    read often holds several events: they are passed on together, in one write)."""

    def __init__(self, conn: _Conn) -> None:
        self._reader = conn.reader
        self._parser = httptools.HttpResponseParser(self)
        self._parts: list[bytes] = []
        self._rest = b""
        self._headed = False
        self.status = 0
        self.done = False  # the whole body was read
        self.keep = False
        self.got_bytes = False
        self._framed = False  # a length or chunked body (else it ends with the connection)

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        low = name.lower()
        if low == b"content-length" or (
            low == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headed = True
        self.status = self._parser.get_status_code()
        self.keep = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._parts.append(body)

    def on_message_complete(self) -> None:
        self.done = True

    async def _feed(self) -> bool:
        """Read once and parse; False at the end of the connection's data."""
        data = await self._reader.read(65536)
        if not data:
            if not self._headed:
                raise HTTPError("the connection closed before an answer")
            if self._framed and not self.done:
                raise HTTPError("the connection closed in the middle of the answer")
            return False  # a body that ends with the connection
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise HTTPError(f"not an HTTP/1.1 answer: {exc}") from exc
        return True

    async def head(self) -> None:
        while not self._headed:
            await self._feed()

    async def read(self) -> bytes:
        """The rest of the body (an error's answer)."""
        while not self.done and await self._feed():
            pass
        out, self._parts = b"".join(self._parts), []
        return out

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """The `data:` payloads (stripped bytes, `[DONE]` included) of the events complete
        after each read, until the body ends."""
        while True:
            if self._parts:
                buf = self._rest + b"".join(self._parts)
                self._parts = []
                lines = buf.split(b"\n")
                self._rest = b"" if self.done else lines.pop()
                out = [ln[5:].strip() for ln in lines if ln[:5] == b"data:"]
                if out:
                    yield out
            if self.done or not await self._feed():
                break
        if self._rest[:5] == b"data:":  # a last event without its blank line
            yield [self._rest[5:].strip()]
        self._rest = b""
