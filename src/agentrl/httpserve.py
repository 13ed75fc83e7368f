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


class _Server(uvicorn.Server):
    """uvicorn without its own SIGINT/SIGTERM handlers: the stack owns the signals (uvicorn's
    replaced them, and re-raised a captured Ctrl-C after each server's exit)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class ListenError(RuntimeError):
    """The server could not listen on its address (port taken, address not local)."""


async def serve_http(
    app: Any, host: str, port: int, stop: asyncio.Event, what: str, **config: Any
) -> None:
    """Serve `app` on host:port until `stop` is set; raise `ListenError` when it cannot bind
    (the stack's supervisor restarts the service with backoff and shows the error)."""
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=int(GRACE_S),
            # no logging set-up of uvicorn's own (a dictConfig at each start, stderr handlers):
            # its records go where agentrl's go (the console, or a long command's log file)
            **{"log_config": None, "timeout_keep_alive": KEEP_ALIVE_S, **config},
        )
    )

    async def guarded() -> None:
        try:
            await server.serve()
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
