"""Issue 49.3: costly structured-output compiles cannot starve decoding. Over a real served
gateway on the local engine, through the official openai SDK: six distinct 15,000-property
schemas (2.7 s of compile each, once in the default executor the decodes use) are refused
before any work, and six distinct schemas under the bounds compile in the grammar pool of
their own, two per caller at most, while an ordinary request answers about as fast as
alone. The constraint is cached by the raw fields' hash and bounded without recursion."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from agentrl.serving import structured
from agentrl.serving.backends import LocalBackend
from agentrl.serving.gateway import GatewayState, create_gateway_app
from agentrl.serving.openai_types import ChatRequest
from deploy_helpers import free_port

MSG = [{"role": "user", "content": "Say something."}]


def wide(n: int, tag: str) -> dict[str, Any]:
    """`n` required string properties, named after `tag` (distinct schemas, no cache hit)."""
    names = [f"{tag}_{i}" for i in range(n)]
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in names}}
    return {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": schema | {"required": names}},
    }


@pytest.fixture()
async def gw(engine: Any, tmp_path: Path):
    import uvicorn

    state = GatewayState("pol", timeout_s=60.0)
    state.backends["p-base"] = LocalBackend(engine, tmp_path)
    state.set_split({"p-base": 100.0}, ["p-base"])
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_gateway_app(state),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    try:
        yield state, client
    finally:
        await client.close()
        server.should_exit = True
        await task


async def _ordinary(client: AsyncOpenAI) -> float:
    started = time.perf_counter()
    out = await client.chat.completions.create(
        model="pol", messages=MSG, max_tokens=4, temperature=0
    )
    assert out.choices[0].message.content is not None
    return time.perf_counter() - started


async def _constrained(client: AsyncOpenAI, fmt: dict[str, Any]) -> int:
    try:
        await client.chat.completions.create(
            model="pol",
            messages=MSG,
            max_tokens=2,
            response_format=fmt,  # type: ignore[arg-type]
        )
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


async def test_huge_schemas_in_flight_do_not_delay_an_ordinary_request(gw: Any) -> None:
    state, client = gw
    await _ordinary(client)  # warm
    alone = statistics.median([await _ordinary(client) for _ in range(3)])

    # six distinct 15,000-property schemas: refused before any work (400), never counted
    tag = uuid.uuid4().hex[:6]
    huge = [asyncio.create_task(_constrained(client, wide(15_000, f"h{tag}{i}"))) for i in range(6)]
    await asyncio.sleep(0.05)
    during = await _ordinary(client)
    assert await asyncio.gather(*huge) == [400] * 6
    assert during < alone + 1.0, (during, alone)

    # six distinct schemas under the bounds (~0.1-0.5 s of compile each): compiled in the
    # grammar pool, at most two per caller at once; the ordinary request is not queued
    # behind them
    peak = {"busy": 0, "mine": 0}
    watching = True

    async def watch() -> None:
        while watching:
            peak["busy"] = max(peak["busy"], structured.SLOTS.busy)
            peak["mine"] = max([peak["mine"], *structured.SLOTS.by_caller.values()])
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    errors = state.stats_for("p-base").errors
    tag = uuid.uuid4().hex[:6]
    costly = [
        asyncio.create_task(_constrained(client, wide(1_900, f"c{tag}{i}"))) for i in range(6)
    ]
    deadline = time.monotonic() + 30
    while structured.SLOTS.busy == 0:  # the compiles are in flight
        assert time.monotonic() < deadline and not all(t.done() for t in costly), "no compile"
        await asyncio.sleep(0.005)
    during = await _ordinary(client)
    codes = await asyncio.gather(*costly)
    watching = False
    await watcher
    assert during < alone + 1.0, (during, alone, codes)
    assert all(c in (200, 400, 429) for c in codes), codes  # never the version's failure
    assert codes.count(200) >= 1, codes
    assert state.stats_for("p-base").errors == errors
    assert 1 <= peak["mine"] <= structured.MAX_COMPILES_PER_CALLER, peak
    assert peak["busy"] <= structured.MAX_COMPILES


def test_constraint_is_bounded_and_cached_by_the_raw_fields() -> None:
    def req(fmt: Any = None, **kw: Any) -> ChatRequest:
        return ChatRequest(model="m", messages=MSG, response_format=fmt, **kw)

    fmt = wide(3, uuid.uuid4().hex[:6])
    first = structured.constraint_for(req(fmt))
    again = structured.constraint_for(req(fmt))  # a new request with the same fields
    assert first is not None and again is first
    # 10,000 levels as a JSON string (guided_json): refused, no RecursionError
    deep = '{"type":"array","items":' * 10_000 + "{}" + "}" * 10_000
    with pytest.raises(structured.StructuredOutputError, match=r"not JSON|nested deeper"):
        structured.constraint_for(req(guided_json=deep))
    deep = '{"type":"array","items":' * 200 + "{}" + "}" * 200
    with pytest.raises(structured.StructuredOutputError, match="nested deeper than 64"):
        structured.constraint_for(req(guided_json=deep))
    with pytest.raises(structured.StructuredOutputError, match="more than 2000 properties"):
        structured.constraint_for(req(wide(2_001, "p")))
    with pytest.raises(structured.StructuredOutputError, match="characters"):
        structured.constraint_for(req(guided_regex="a" * (structured.MAX_TEXT + 1)))
