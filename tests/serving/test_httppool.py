"""The gateway's upstream keep-alive pool against a real uvicorn server that closes idle
connections (uvicorn's keep-alive timeout; 5 s by default, 1 s here): connections the server
closed are never used again, and a request is never lost to them (it once was: the retry took
the next idle connection, closed as well, and the client got a 502)."""

from __future__ import annotations

import asyncio

import uvicorn

from agentrl.bench.gateway import backend_app
from agentrl.serving.httppool import JsonPool
from deploy_helpers import free_port

BODY = b'{"model": "x", "messages": [{"role": "user", "content": "hi"}]}'


async def test_connections_the_server_closed_are_not_reused() -> None:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            backend_app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=1,
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    pool = JsonPool(f"http://127.0.0.1:{port}/v1")
    try:
        first = await asyncio.gather(*(pool.post("/chat/completions", BODY) for _ in range(8)))
        assert [s for s, _ in first] == [200] * 8
        assert len(pool.idle) == 8
        await asyncio.sleep(2.0)  # the server closes all eight idle connections
        again = await asyncio.gather(*(pool.post("/chat/completions", BODY) for _ in range(8)))
        assert [s for s, _ in again] == [200] * 8
        assert len(pool.idle) <= 8
    finally:
        pool.close()
        server.should_exit = True
        await task
