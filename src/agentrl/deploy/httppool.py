"""A small keep-alive HTTP/1.1 client for the gateway's hot path: POST a JSON body, read a
Content-Length or chunked answer. httpx costs about as much CPU per call as the rest of the
gateway together (connection-pool bookkeeping, anyio layers), which decides the gateway's
added latency at high request rates; streaming and everything unusual still go through
httpx. TCP_NODELAY is set: a request is one write.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from urllib.parse import urlsplit


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

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()
