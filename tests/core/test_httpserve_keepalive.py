"""An idle keep-alive connection outlives the openai SDK's pool expiry (httpx: 5 s).

With uvicorn's default (5 s) the server closed such a connection just as the client reused
it: "Server disconnected without sending a response", an APIConnectionError the loop's
agents retried a few times a run. The same exchange against a server keeping the old 5 s
shows the test can fail.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrl.bus.server import free_port
from agentrl.core.httpserve import KEEP_ALIVE_S, serve_http

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


async def _reuse_after(port: int, idle_s: float) -> bytes:
    """The status line of a second request sent on one connection after `idle_s` idle."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for attempt in range(2):
            if attempt:
                await asyncio.sleep(idle_s)
            writer.write(REQUEST)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(2)
        return head.split(b"\r\n", 1)[0]
    except (asyncio.IncompleteReadError, ConnectionError):
        return b"closed by the server"
    finally:
        writer.close()


async def test_an_idle_connection_is_reused_after_the_sdks_pool_expiry() -> None:
    assert KEEP_ALIVE_S > 15  # httpx 5 s, aiohttp 15 s
    stop = asyncio.Event()
    ours, old = free_port(), free_port()
    servers = [
        asyncio.create_task(serve_http(app, "127.0.0.1", ours, stop, "ours")),
        asyncio.create_task(serve_http(app, "127.0.0.1", old, stop, "old", timeout_keep_alive=5)),
    ]
    try:
        for port in (ours, old):
            for _ in range(200):
                try:
                    _, w = await asyncio.open_connection("127.0.0.1", port)
                    w.close()
                    break
                except OSError:
                    await asyncio.sleep(0.02)
        now, before = await asyncio.gather(_reuse_after(ours, 6.0), _reuse_after(old, 6.0))
        assert now == b"HTTP/1.1 200 OK"
        assert before == b"closed by the server"
    finally:
        stop.set()
        await asyncio.gather(*servers)
