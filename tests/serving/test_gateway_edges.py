"""Issue 33.9: the gateway under load. A client that disconnects mid-stream, or a request that
times out, cancels its generation (the decode loop stops: the engine's `cancelled` counter
and `active` gauge show it) instead of decoding to max_tokens for nobody; beyond
`max_inflight` requests the gateway sheds load with 429 + Retry-After. Real HTTP, the
official openai SDK and httpx, a tiny local model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from agentrl.core.httpserve import serve_http
from agentrl.serving.backends import LocalBackend
from agentrl.serving.gateway import GatewayState, create_gateway_app
from deploy_helpers import free_port

MSG = [{"role": "user", "content": "Tell me a long story."}]
LONG = 1900  # the tiny model's context is 2048: long enough to take seconds on CPU


@pytest.fixture()
async def gw(engine: Any, tmp_path: Path):
    state = GatewayState("edge-policy", timeout_s=60.0)
    state.backends["edge-base"] = LocalBackend(engine, tmp_path)
    state.set_split({"edge-base": 100.0}, ["edge-base"])
    port = free_port()
    stop = asyncio.Event()
    server = asyncio.create_task(
        serve_http(create_gateway_app(state), "127.0.0.1", port, stop, "gateway")
    )
    url = f"http://127.0.0.1:{port}/v1"
    async with httpx.AsyncClient() as c:
        for _ in range(200):
            try:
                await c.get(f"{url}/models")
                break
            except httpx.TransportError:
                await asyncio.sleep(0.02)
    client = AsyncOpenAI(base_url=url, api_key="k", max_retries=0)
    try:
        yield state, client, url
    finally:
        await client.close()
        stop.set()
        await asyncio.wait_for(server, 20)


async def _settled(engine: Any, cancelled_before: int, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if engine.stats.cancelled > cancelled_before and engine.stats.active == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"decode did not stop: {engine.stats}")


async def test_client_disconnect_mid_stream_stops_the_decode(gw: Any, engine: Any) -> None:
    state, client, _ = gw
    before, tokens_before = engine.stats.cancelled, engine.stats.new_tokens
    stream = await client.chat.completions.create(
        model="edge-policy", messages=MSG, max_tokens=LONG, temperature=1.0, stream=True
    )
    seen = 0
    async for _chunk in stream:
        seen += 1
        if seen == 4:
            break
    await stream.close()  # the client goes away mid-stream
    await _settled(engine, before)
    assert engine.stats.new_tokens - tokens_before < LONG // 2, engine.stats
    for _ in range(100):
        if state.inflight == 0:
            break
        await asyncio.sleep(0.02)
    assert state.inflight == 0 and state.abandoned >= 1


async def test_timeout_cancels_the_generation(gw: Any, engine: Any) -> None:
    state, client, _ = gw
    state.timeout_s = 0.3
    before, tokens_before = engine.stats.cancelled, engine.stats.new_tokens
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(model="edge-policy", messages=MSG, max_tokens=LONG)
    assert err.value.status_code == 504
    await _settled(engine, before)
    assert engine.stats.new_tokens - tokens_before < LONG, engine.stats


async def test_client_that_gives_up_waiting_cancels_the_generation(gw: Any, engine: Any) -> None:
    state, _, url = gw
    before = engine.stats.cancelled
    async with httpx.AsyncClient(timeout=0.3) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post(
                f"{url}/chat/completions",
                json={"model": "edge-policy", "messages": MSG, "max_tokens": LONG},
            )
    await _settled(engine, before)
    for _ in range(100):
        if state.abandoned >= 1:
            break
        await asyncio.sleep(0.02)
    assert state.abandoned >= 1 and state.inflight == 0


async def test_requests_beyond_the_bound_are_shed_with_429(gw: Any, engine: Any) -> None:
    state, client, _ = gw
    state.max_inflight = 1
    holding = await client.chat.completions.create(
        model="edge-policy", messages=MSG, max_tokens=LONG, stream=True
    )
    try:
        await holding.__anext__()  # the one allowed request is streaming
        with pytest.raises(openai.RateLimitError) as err:
            await client.chat.completions.create(model="edge-policy", messages=MSG, max_tokens=2)
        assert err.value.response.headers["retry-after"] == "1"
        assert state.shed == 1
    finally:
        await holding.close()
    for _ in range(200):  # once the stream is gone, requests are admitted again
        if state.inflight == 0:
            break
        await asyncio.sleep(0.02)
    done = await client.chat.completions.create(model="edge-policy", messages=MSG, max_tokens=2)
    assert done.usage is not None and done.usage.completion_tokens == 2
