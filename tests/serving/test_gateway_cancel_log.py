"""Issue 33.3: a stream the client closes early (Agent Zero's `aclose()` at the first complete
JSON tool request) is still in the completion log, under the completion id the gateway named
at stream start: the prompt's token ids, exactly the tokens the client was sent with their
log-probs, `finish_reason: cancelled`, and the structured-output marks of a constrained
request. Real HTTP, the official openai SDK, a real nats-server, a tiny local model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from agentrl.bus import Bus
from agentrl.core.httpserve import serve_http
from agentrl.serving.backends import LocalBackend
from agentrl.serving.gateway import (
    COMPLETION_HEADER,
    CompletionLog,
    GatewayState,
    create_gateway_app,
)
from agentrl.serving.openai_types import ChatRequest
from deploy_helpers import free_port

MSG = [{"role": "user", "content": "Tell me a long story."}]
LONG = 1500  # seconds of decoding on CPU: the client is gone long before


@pytest.fixture()
async def gw(engine: Any, nats_url: str, tmp_path: Path):
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    log = CompletionLog(bus)
    stop_log = asyncio.Event()
    log_task = asyncio.create_task(log.run(stop_log))
    state = GatewayState("cancel-policy", completion_log=log, timeout_s=60.0)
    state.backends["cancel-base"] = LocalBackend(engine, tmp_path)
    state.set_split({"cancel-base": 100.0}, ["cancel-base"])
    port = free_port()
    stop = asyncio.Event()
    server = asyncio.create_task(
        serve_http(create_gateway_app(state), "127.0.0.1", port, stop, "gateway")
    )
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    for _ in range(200):
        try:
            await client.models.list()
            break
        except Exception:
            await asyncio.sleep(0.02)
    try:
        yield state, client, bus
    finally:
        await client.close()
        stop.set()
        await asyncio.wait_for(server, 20)
        stop_log.set()
        await log_task
        await bus.close()


async def rows_of(bus: Bus, completion_id: str, settle_s: float = 1.0) -> list[dict[str, Any]]:
    """Every completion-log row of `completion_id` (waits for the first, then `settle_s`)."""

    async def scan() -> list[dict[str, Any]]:
        info = await bus.js.stream_info("RL_COMPLETIONS")
        out = []
        for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
            data = json.loads((await bus.js.get_msg("RL_COMPLETIONS", seq)).data)
            if data["completion_id"] == completion_id:
                out.append(data)
        return out

    for _ in range(100):
        if await scan():
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(settle_s)
    return await scan()


async def close_after(client: AsyncOpenAI, chunks: int, **kw: Any) -> tuple[str, str, str]:
    """Stream, read `chunks` chunks, close: (completion id of the header, of the chunks, text)."""
    raw = await client.chat.completions.with_raw_response.create(
        model="cancel-policy", messages=MSG, max_tokens=LONG, stream=True, **kw
    )
    header = raw.headers[COMPLETION_HEADER]
    stream = raw.parse()
    text, ids, seen = "", set(), 0
    async for chunk in stream:
        ids.add(chunk.id)
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        seen += 1
        if seen == chunks:
            break
    await stream.close()  # Agent Zero's aclose(): the client goes away mid-stream
    (chunk_id,) = ids
    return header, chunk_id, text


async def test_an_early_closed_stream_is_logged_with_the_tokens_it_was_sent(
    gw: Any, engine: Any
) -> None:
    _, client, bus = gw
    header, chunk_id, text = await close_after(client, 6, temperature=1.0)
    assert header == chunk_id
    (row,) = await rows_of(bus, header)
    assert row["finish_reason"] == "cancelled"
    assert row["model"] == "cancel-base"
    request = ChatRequest.model_validate({"model": "cancel-policy", "messages": MSG})
    assert row["prompt_token_ids"] == engine.encode(request)
    toks = row["completion_token_ids"]
    assert 0 < len(toks) < LONG // 2 and len(row["completion_logprobs"]) == len(toks)
    assert all(lp <= 0.0 for lp in row["completion_logprobs"])
    # the tokens the client was sent, no more: what it read is their text (or a prefix of it,
    # the SDK reads ahead of the loop that broke off), never a token it was not sent
    sent = engine.tokenizer.decode(toks, skip_special_tokens=True)
    assert sent.startswith(text) and len(text) > 0
    assert not row.get("constrained") and row.get("schema_hash") is None


async def test_a_cancelled_constrained_stream_keeps_its_schema_marks(gw: Any) -> None:
    _, client, bus = gw
    schema = {
        "type": "object",
        "properties": {"thoughts": {"type": "array", "items": {"type": "string"}}},
        "required": ["thoughts"],
    }
    header, _, _ = await close_after(
        client,
        5,
        temperature=1.0,
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    )
    (row,) = await rows_of(bus, header)
    assert row["finish_reason"] == "cancelled"
    assert row["constrained"] is True and row["schema_hash"]
    assert len(row["completion_token_ids"]) == len(row["completion_logprobs"]) > 0


async def test_a_finished_stream_is_logged_once_with_its_finish_reason(gw: Any) -> None:
    _, client, bus = gw
    raw = await client.chat.completions.with_raw_response.create(
        model="cancel-policy", messages=MSG, max_tokens=5, temperature=1.0, stream=True
    )
    header = raw.headers[COMPLETION_HEADER]
    async for _ in raw.parse():
        pass
    (row,) = await rows_of(bus, header)
    assert row["finish_reason"] in ("stop", "length")
    assert 0 < len(row["completion_token_ids"]) <= 5
