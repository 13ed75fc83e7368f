"""Issue 51.7: a streamed `guided_choice` (and `structured_outputs.choice`) is decoded token
by token, as free text is: its chunks come as the answer decodes (not all at once after it),
the text is exactly one of the choices, and a client that closes the stream stops the
decode (the engine's `cancelled` counter and token count show it). Real uvicorn gateway, the
official openai SDK, a tiny random local model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from openai import AsyncOpenAI

from agentrl.core.httpserve import serve_http
from agentrl.serving.backends import LocalBackend
from agentrl.serving.decoding import ChoiceMatcher
from agentrl.serving.gateway import GatewayState, create_gateway_app
from agentrl.serving.openai_types import ChatRequest
from deploy_helpers import free_port

MSG = [{"role": "user", "content": "Pick one."}]
# two long choices (hundreds of tokens each): seconds of decoding on CPU
LONG_CHOICES = [" ".join(f"alpha{i}" for i in range(250)), " ".join(f"beta{i}" for i in range(250))]
# a streamed answer decoded whole: 230 tokens each (the long ones are 890), still many chunks
STREAM_CHOICES = [" ".join(f"alpha{i}" for i in range(80)), " ".join(f"beta{i}" for i in range(80))]
MOVES = ["left", "down", "right", "up"]


@pytest.fixture()
async def gw(engine: Any, tmp_path: Path):
    state = GatewayState("choice-policy", timeout_s=60.0)
    state.backends["choice-base"] = LocalBackend(engine, tmp_path)
    state.set_split({"choice-base": 100.0}, ["choice-base"])
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
        yield state, client
    finally:
        await client.close()
        stop.set()
        await asyncio.wait_for(server, 20)


def test_choice_matcher_walks_the_trie_and_ends_a_choice_that_prefixes_another() -> None:
    eos = {0}
    m = ChoiceMatcher([[5, 6], [5], [7, 8, 9]], eos)
    assert sorted(m.allowed()) == [5, 7]
    assert m.consume_token(5) and not m.is_stopped()
    assert sorted(m.allowed()) == [0, 6]  # "5" is complete, "5 6" goes on
    assert m.consume_token(0) and m.chosen == 1
    m = ChoiceMatcher([[5, 6], [5], [7, 8, 9]], eos)
    assert m.consume_token(7) and m.consume_token(8) and not m.is_stopped()
    assert m.consume_token(9) and m.chosen == 2
    m = ChoiceMatcher([[5, 6]], eos)
    assert not m.consume_token(6) and "no choice" in m.get_error()


@pytest.mark.parametrize("how", ["guided_choice", "structured_outputs"])
async def test_a_streamed_choice_comes_token_by_token(gw: Any, engine: Any, how: str) -> None:
    _, client = gw
    extra = (
        {"guided_choice": STREAM_CHOICES}
        if how == "guided_choice"
        else {"structured_outputs": {"choice": STREAM_CHOICES}}
    )
    stream = await client.chat.completions.create(
        model="choice-policy", messages=MSG, temperature=1.0, stream=True, extra_body=extra
    )
    parts: list[str] = []
    decoding_at_first = None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if decoding_at_first is None:
                decoding_at_first = engine.stats.active
            parts.append(chunk.choices[0].delta.content)
    text = "".join(parts)
    assert text in STREAM_CHOICES
    # the answer came in many chunks, the first while the row was still decoding (the
    # scoring path sent one chunk after the whole answer)
    assert len(parts) > 50, len(parts)
    assert decoding_at_first == 1


async def test_closing_a_choice_stream_stops_the_decode(gw: Any, engine: Any) -> None:
    state, client = gw
    before, tokens_before = engine.stats.cancelled, engine.stats.new_tokens
    stream = await client.chat.completions.create(
        model="choice-policy",
        messages=MSG,
        temperature=1.0,
        stream=True,
        extra_body={"guided_choice": LONG_CHOICES},
    )
    seen = 0
    async for _chunk in stream:
        seen += 1
        if seen == 4:
            break
    await stream.close()  # the client goes away mid-answer
    for _ in range(500):
        if engine.stats.cancelled > before and engine.stats.active == 0:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"decode did not stop: {engine.stats}")
    longest = max(len(engine.tokenizer(c)["input_ids"]) for c in LONG_CHOICES)
    assert engine.stats.new_tokens - tokens_before < longest // 2, engine.stats
    for _ in range(100):
        if state.inflight == 0:
            break
        await asyncio.sleep(0.02)
    assert state.inflight == 0 and state.abandoned >= 1


async def test_a_streamed_one_token_choice_is_the_scored_one_when_greedy(engine: Any) -> None:
    """Choices of one token each: the stream's masked softmax is the scoring path's
    renormalised distribution, so greedy picks the same move."""
    from agentrl.llm.choices import candidate_ids, single_token_ids

    assert single_token_ids(candidate_ids(engine.tokenizer, MOVES)) is not None
    for i in range(4):
        req = ChatRequest(
            model="m",
            messages=[{"role": "user", "content": f"State {i}: where to?"}],
            guided_choice=MOVES,
            temperature=0.0,
        )
        scored = await engine.generate(None, req)
        got: list[int] = []
        streamed = await engine.generate(None, req, lambda t, lp, tops, got=got: got.append(t))
        assert streamed.content == scored.content and streamed.finish_reason == "stop"
        assert got == streamed.completion_token_ids == scored.completion_token_ids
        renorm = torch.log_softmax(torch.tensor(_move_logits(engine, req)), -1)
        assert streamed.token_logprobs[0] == pytest.approx(float(renorm.max()), abs=1e-4)


def _move_logits(engine: Any, req: ChatRequest) -> list[float]:
    """The base model's log-probs of the moves' tokens after the request's prompt."""
    from agentrl.llm.choices import candidate_ids

    _, ids = engine._prompt(req)
    return [s[0] for s in engine.score(None, ids, candidate_ids(engine.tokenizer, MOVES))]


async def test_closing_a_structured_output_stream_stops_the_decode(gw: Any, engine: Any) -> None:
    """The grammar path too: a regex whose every match is hundreds of tokens long."""
    _, client = gw
    before, tokens_before = engine.stats.cancelled, engine.stats.new_tokens
    stream = await client.chat.completions.create(
        model="choice-policy",
        messages=MSG,
        temperature=1.0,
        max_tokens=1900,
        stream=True,
        extra_body={"guided_regex": "(x,){1200}"},  # at least 600 tokens ("x," at best)
    )
    seen = 0
    async for _chunk in stream:
        seen += 1
        if seen == 4:
            break
    await stream.close()
    for _ in range(500):
        if engine.stats.cancelled > before and engine.stats.active == 0:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"decode did not stop: {engine.stats}")
    assert engine.stats.new_tokens - tokens_before < 300, engine.stats
