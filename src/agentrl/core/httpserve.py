"""Run a uvicorn server as one supervised service task: until `stop`, with a bounded
shutdown, and a port it cannot bind reported as an ordinary exception.

Why: uvicorn calls `sys.exit` when it cannot listen; a `SystemExit` raised inside an asyncio
task escapes the event loop and ended the whole `agentrl up`. And uvicorn waits without limit
for open connections (a stream decoding for a client) when asked to exit, so Ctrl-C hung.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from typing import Any

import uvicorn

GRACE_S = 3.0  # open requests get this long to finish when the stack stops
# How long an idle keep-alive connection stays open. uvicorn's default (5 s) equals the
# idle expiry of httpx's pool (the openai SDK's): a client reusing a connection at ~5 s
# raced the server's close and got "Server disconnected" (an APIConnectionError, a retry).
# Well above the common clients' expiries, so the client is the one that closes (nginx: 75).
KEEP_ALIVE_S = 75


class _OneWriteTransport:
    """A transport that sends an HTTP/1.1 response head together with what follows it.

    Why: uvicorn writes a response's head and its body with two `transport.write` calls, and
    asyncio sends each at once: two `send` syscalls and two wake-ups of the client per answer.
    Under py-spy at 1,000 requests/s the gateway's socket writes were a fifth of its CPU. The
    head is held until the next write (the body, in the same step: one syscall) or, when no
    write follows, until the loop's next turn (`call_soon`); everything else passes through.
    """

    __slots__ = ("_held", "_loop", "_t")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._t = transport
        self._held: bytes | None = None
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._t.write(held + bytes(data))
        elif data[:9] == b"HTTP/1.1 " and data[-4:] == b"\r\n\r\n":
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._t.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._t.is_closing():
            self._t.write(held)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def close(self) -> None:
        self.flush()
        self._t.close()

    def write_eof(self) -> None:
        self.flush()
        self._t.write_eof()

    def abort(self) -> None:
        self._held = None
        self._t.abort()

    def get_write_buffer_size(self) -> int:
        return self._t.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:  # everything else is the real transport's
        return getattr(self._t, name)


def one_write_http() -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (httptools when installed, else h11) over a transport that
    sends each response's head and body in one write (pass as `http=` to uvicorn.Config)."""
    global _ONE_WRITE
    if _ONE_WRITE is None:
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
        except ImportError:  # httptools missing: the pure-Python parser
            from uvicorn.protocols.http.h11_impl import H11Protocol as base  # type: ignore[assignment]

        class OneWrite(base):  # type: ignore[valid-type,misc]
            def connection_made(self, transport: Any) -> None:
                super().connection_made(_OneWriteTransport(transport))  # type: ignore[arg-type]

        _ONE_WRITE = OneWrite
    return _ONE_WRITE


_ONE_WRITE: type[asyncio.Protocol] | None = None


class _Server(uvicorn.Server):
    """uvicorn without its own SIGINT/SIGTERM handlers: the stack owns the signals (uvicorn's
    replaced them, and re-raised a captured Ctrl-C after each server's exit)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class ListenError(RuntimeError):
    """The server could not listen on its address (port taken, address not local)."""


async def serve_http(
    app: Any,
    host: str,
    port: int,
    stop: asyncio.Event,
    what: str,
    sock: Any = None,
    **config: Any,
) -> None:
    """Serve `app` on host:port until `stop` is set; raise `ListenError` when it cannot bind
    (the stack's supervisor restarts the service with backoff and shows the error). `sock`:
    a socket already bound (several gateway processes share a port through SO_REUSEPORT)."""
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=int(GRACE_S),
            # no logging set-up of uvicorn's own (a dictConfig at each start, stderr handlers):
            # its records go where agentrl's go (the console, or a long command's log file)
            **{
                "log_config": None,
                "timeout_keep_alive": KEEP_ALIVE_S,
                "http": one_write_http(),
                **config,
            },
        )
    )

    async def guarded() -> None:
        try:
            await server.serve(sockets=[sock] if sock is not None else None)
        except SystemExit as exc:  # must not escape the task: it would end the event loop
            raise ListenError(
                f"{what} could not listen on {host}:{port} (port in use?) [uvicorn exit {exc.code}]"
            ) from None

    task = asyncio.create_task(guarded(), name=f"{what} http")
    waiter = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        server.should_exit = True
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), GRACE_S + 2)
        if not task.done():
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    if task.done() and not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]
    if not stop.is_set():
        raise ListenError(f"{what} stopped serving on {host}:{port} before the stack stopped")
