"""The gateway over real HTTP through the official openai SDK: local LoRA versions over one
tiny base, upstream versions on a real (scripted) OpenAI-compatible server, errors in
OpenAI's format, auth, the completion log on a real nats-server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from openai import AsyncOpenAI

from agentrl.bench.testing_server import ScriptedOpenAIServer, ScriptedReply, tool_call
from agentrl.serving.backends import LocalBackend, UpstreamBackend
from agentrl.serving.gateway import VERSION_HEADER, CompletionLog, GatewayState, create_gateway_app
from agentrl.serving.registry import ModelRecord
from deploy_helpers import free_port

MSG = [{"role": "user", "content": "Say something."}]


async def serve(app: Any) -> tuple[Any, asyncio.Task[None], int]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, port


async def logged(bus: Any, completion_id: str) -> dict[str, Any] | None:
    """The completion log record of `completion_id` from RL_COMPLETIONS (waits up to 5 s)."""
    for _ in range(50):
        info = await bus.js.stream_info("RL_COMPLETIONS")
        for seq in range(max(1, info.state.last_seq - 100), info.state.last_seq + 1):
            data = json.loads((await bus.js.get_msg("RL_COMPLETIONS", seq)).data)
            if data["completion_id"] == completion_id:
                return dict(data)
        await asyncio.sleep(0.1)
    return None


@pytest.fixture()
async def gateway(engine: Any, checkpoints: list[str], nats_url: str, tmp_path: Path):
    from agentrl.bus import Bus

    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    log = CompletionLog(bus)
    stop = asyncio.Event()
    log_task = asyncio.create_task(log.run(stop))
    state = GatewayState("agentrl-policy", completion_log=log, timeout_s=60.0)
    local = LocalBackend(engine, tmp_path)
    for i, ckpt in enumerate(checkpoints[:2], start=1):
        await local.prepare(
            ModelRecord(
                model_id=f"p-v{i}",
                version=i,
                public_name="agentrl-policy",
                base_model="tiny",
                checkpoint_path=ckpt,
            )
        )
        state.backends[f"p-v{i}"] = local
    # the base itself, prepared as the serving manager does (checkpoint None): a backend
    # that prepared versions serves only those (an id it never prepared is a 404)
    await local.prepare(
        ModelRecord(model_id="p-base", version=0, public_name="agentrl-policy", base_model="tiny")
    )
    state.backends["p-base"] = local
    with (
        ScriptedOpenAIServer([ScriptedReply(content="boom", status=500)]) as bad,
        ScriptedOpenAIServer([ScriptedReply(content="late", delay=5.0)]) as slow,
        ScriptedOpenAIServer(
            [
                ScriptedReply(
                    content=None, tool_calls=[tool_call("calculator", {"expression": "2+2"})]
                )
            ]
        ) as tools,
    ):
        state.backends["p-bad"] = UpstreamBackend(bad.base_url, timeout_s=10)
        state.backends["p-slow"] = UpstreamBackend(slow.base_url, timeout_s=1.0)
        state.backends["p-tools"] = UpstreamBackend(tools.base_url, timeout_s=10)
        state.set_split({"p-v1": 50.0, "p-v2": 50.0}, ["p-v2", "p-v1"])
        server, task, port = await serve(create_gateway_app(state))
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        try:
            yield state, client, bus, port
        finally:
            await client.close()
            server.should_exit = True
            await task
            stop.set()
            await log_task
            await bus.close()


async def test_completion_names_its_version_with_logprobs(gateway: Any) -> None:
    state, client, _, _ = gateway
    raw = await client.chat.completions.with_raw_response.create(
        model="agentrl-policy",
        messages=MSG,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        user="session-1",
    )
    resp = raw.parse()
    version = raw.headers[VERSION_HEADER]
    assert resp.model == version and version in ("p-v1", "p-v2")
    lp = resp.choices[0].logprobs.content
    assert len(lp) == resp.usage.completion_tokens == 6
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in lp)
    # greedy: the chosen token is the most likely one
    assert all(abs(t.logprob - t.top_logprobs[0].logprob) < 1e-5 for t in lp)
    # sticky: the same user is always served by the same version
    again = [
        await client.chat.completions.with_raw_response.create(
            model="agentrl-policy", messages=MSG, max_tokens=1, user="session-1"
        )
        for _ in range(5)
    ]
    assert {r.headers[VERSION_HEADER] for r in again} == {version}
    assert state.stats[version].requests >= 6


async def test_streaming_matches_non_streaming(gateway: Any) -> None:
    _, client, _, _ = gateway
    full = await client.chat.completions.create(
        model="p-v2", messages=MSG, max_tokens=8, temperature=0
    )
    stream = await client.chat.completions.create(
        model="p-v2",
        messages=MSG,
        max_tokens=8,
        temperature=0,
        stream=True,
        logprobs=True,
        stream_options={"include_usage": True},
    )
    text, finish, models, usage, n_lp = "", None, set(), None, 0
    async for c in stream:
        models.add(c.model)
        if c.usage:
            usage = c.usage
        for ch in c.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
            n_lp += len(ch.logprobs.content) if ch.logprobs and ch.logprobs.content else 0
    assert text == full.choices[0].message.content
    assert finish == "length" and models == {"p-v2"}
    assert usage is not None and usage.completion_tokens == 8 and n_lp >= 1


async def test_tool_calls_local_streamed_and_upstream(gateway: Any) -> None:
    _, client, _, _ = gateway
    tools = [
        {
            "type": "function",
            "function": {
                "name": "move",
                "description": "Move.",
                "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}},
            },
        }
    ]
    choices = [
        '{"name": "move", "arguments": {"direction": "up"}}',
        '{"name": "move", "arguments": {"direction": "down"}}',
    ]
    stream = await client.chat.completions.create(
        model="p-v1",
        messages=MSG,
        tools=tools,
        stream=True,
        temperature=0,
        extra_body={"guided_choice": choices},
    )
    calls, finish = [], None
    async for c in stream:
        for ch in c.choices:
            calls += ch.delta.tool_calls or []
            finish = ch.finish_reason or finish
    # OpenAI's deltas: the call's name first, then its arguments in pieces
    arguments = "".join(c.function.arguments or "" for c in calls if c.index == 0)
    assert finish == "tool_calls" and calls[0].function.name == "move"
    assert json.loads(arguments)["direction"] in ("up", "down")
    up = await client.chat.completions.create(model="p-tools", messages=MSG, tools=tools)
    call = up.choices[0].message.tool_calls[0]
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {
        "expression": "2+2"
    }
    assert up.model == "p-tools"


async def test_guided_choice_scores_the_choices(gateway: Any, engine: Any) -> None:
    _, client, _, _ = gateway
    options = ["up", "down", "left", "right"]
    resp = await client.chat.completions.create(
        model="p-v1", messages=MSG, temperature=0, extra_body={"guided_choice": options}
    )
    from agentrl.serving.openai_types import ChatRequest

    prompt = engine.encode(ChatRequest(model="x", messages=MSG))
    ids = [engine.tokenizer(o, add_special_tokens=False)["input_ids"] for o in options]
    scores = [sum(s) for s in engine.score("p-v1", prompt, ids)]
    assert resp.choices[0].message.content == options[max(range(4), key=scores.__getitem__)]


async def test_errors_in_openai_format(gateway: Any) -> None:
    state, client, _, port = gateway
    with pytest.raises(openai.NotFoundError) as nf:
        await client.chat.completions.create(model="gpt-nope", messages=MSG)
    assert "agentrl-policy" in nf.value.message and "p-v1" in nf.value.message
    assert nf.value.body["code"] == "model_not_found"
    with pytest.raises(openai.InternalServerError) as bad:
        await client.chat.completions.create(model="p-bad", messages=MSG)
    assert bad.value.status_code == 502 and "p-bad" in bad.value.message
    with pytest.raises(openai.APIStatusError) as slow:
        await client.chat.completions.create(model="p-slow", messages=MSG)
    assert slow.value.status_code == 504
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(model="p-bad", messages=MSG, stream=True)
    # pinned requests (a version named by its id) count apart from the canary evidence
    assert state.pinned["p-bad"].errors == 2 and state.pinned["p-slow"].timeouts == 1
    assert "p-bad" not in state.stats and "p-slow" not in state.stats
    # the gateway is still up and answers
    ok = await client.chat.completions.create(model="p-v1", messages=MSG, max_tokens=2)
    assert ok.model == "p-v1"
    async with httpx.AsyncClient() as h:
        r = await h.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "p-v1"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


async def test_models_and_bearer_keys(gateway: Any) -> None:
    state, client, _, port = gateway
    ids = [m.id async for m in client.models.list()]
    assert ids[0] == "agentrl-policy" and "p-v1" in ids
    state.api_keys = ["secret"]
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(model="p-v1", messages=MSG, max_tokens=1)
    keyed = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="secret", max_retries=0)
    assert (
        await keyed.chat.completions.create(model="p-v1", messages=MSG, max_tokens=1)
    ).model == "p-v1"
    await keyed.close()


async def test_completion_log_has_exact_tokens(gateway: Any, engine: Any) -> None:
    _, client, bus, _ = gateway
    resp = await client.chat.completions.create(
        model="p-v1",
        messages=MSG,
        max_tokens=5,
        logprobs=True,
        extra_headers={"x-agentrl-session": "s-9"},
    )
    found = await logged(bus, resp.id)
    assert found is not None
    assert found["model"] == "p-v1" and found["session_id"] == "s-9"
    assert len(found["completion_token_ids"]) == 5
    lps = [t.logprob for t in resp.choices[0].logprobs.content]
    assert found["completion_logprobs"] == pytest.approx(lps)
    assert engine.tokenizer.decode(found["completion_token_ids"]) == resp.choices[0].message.content


async def test_lora_versions_match_checkpoint_loaded_alone(
    gateway: Any, engine: Any, checkpoints: list[str]
) -> None:
    """Two adapters over one base give each version exactly its own model's log-probs."""
    from agentrl.llm.loading import load_policy
    from agentrl.serving.openai_types import ChatRequest

    _, client, bus, _ = gateway
    prompt = engine.encode(ChatRequest(model="x", messages=MSG))
    outputs = set()
    for version, ckpt in (("p-v1", checkpoints[0]), ("p-v2", checkpoints[1])):
        resp, _base = await asyncio.gather(  # served in one batch with the bare base
            client.chat.completions.create(
                model=version, messages=MSG, max_tokens=6, temperature=0, logprobs=True
            ),
            client.chat.completions.create(
                model="p-base", messages=MSG, max_tokens=6, temperature=0
            ),
        )
        record = await logged(bus, resp.id)
        assert record is not None
        ids = record["completion_token_ids"]
        outputs.add(tuple(ids))
        alone = load_policy(ckpt).model.eval()
        with torch.no_grad():
            logp = torch.log_softmax(
                alone(input_ids=torch.tensor([prompt + ids])).logits.float(), -1
            )[0]
        expect = [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(ids)]
        served = [t.logprob for t in resp.choices[0].logprobs.content]
        assert served == pytest.approx(expect, abs=1e-4)
        assert record["prompt_token_ids"] == prompt
    assert len(outputs) == 2  # the two versions really are different models


def test_guided_choice_scores_each_prompt_once_per_version(engine: Any) -> None:
    """Agents repeat states: a version's choice distribution for a prompt is computed once;
    the cached answer is the same distribution, computed as scoring without the cache."""
    from agentrl.serving.openai_types import ChatRequest

    req = ChatRequest(
        model="x",
        messages=[{"role": "user", "content": "Move: up, down, left or right?"}],
        guided_choice=["up", "down", "left", "right"],
        temperature=0.0,
        logprobs=True,
        top_logprobs=4,
    )
    engine._choice_cache.clear()
    first = asyncio.run(engine.generate(None, req))
    assert len(engine._choice_cache) == 1
    second = asyncio.run(engine.generate(None, req))
    assert len(engine._choice_cache) == 1
    assert first.content == second.content and first.top_logprobs == second.top_logprobs
    assert first.token_logprobs == pytest.approx(second.token_logprobs)
    # the cached per-token log-prob is the model's own (scored without the cache)
    fresh = engine.score(None, first.prompt_token_ids, [first.completion_token_ids])[0]
    assert first.token_logprobs == pytest.approx(fresh, abs=1e-5)


def test_temperature_above_two_only_with_guided_choice() -> None:
    from pydantic import ValidationError

    from agentrl.serving.openai_types import ChatRequest

    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValidationError, match="above 2 only with guided_choice"):
        ChatRequest(model="m", messages=msgs, temperature=3.0)
    ok = ChatRequest(model="m", messages=msgs, temperature=6.0, guided_choice=["a", "b"])
    assert ok.temperature == 6.0


def test_concurrent_requests_for_a_new_prompt_share_one_scoring(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents of one group reach the same state together: one forward pass serves them all."""
    from agentrl.serving.openai_types import ChatRequest

    scored: list[Any] = []
    real = engine._score_many

    def counted(items: Any) -> Any:
        scored.extend(key for key, *_ in items)
        return real(items)

    monkeypatch.setattr(engine, "_score_many", counted)
    req = ChatRequest(
        model="x",
        messages=[{"role": "user", "content": "A state all eight agents reach at once."}],
        guided_choice=["up", "down", "left", "right"],
        temperature=1.0,
    )
    engine._choice_cache.clear()

    async def burst() -> list[Any]:
        return await asyncio.gather(*(engine.generate(None, req) for _ in range(8)))

    outs = asyncio.run(burst())
    assert len(scored) == 1
    assert {o.content for o in outs} <= {"up", "down", "left", "right"}
    assert not engine._inflight


async def test_choice_prompts_waiting_together_share_a_pass_each_under_its_version(
    gateway: Any, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Episodes in different states (and versions, in a canary) wait together: their prompts
    are scored in one padded pass, each row exactly what it scores alone under its adapter."""
    from agentrl.serving.openai_types import ChatRequest

    moves = ["up", "down", "left", "right"]
    passes: list[list[str]] = []
    real = engine._next_logits

    def counted(rows: list[Any]) -> Any:
        passes.append([r.adapter for r in rows])
        return real(rows)

    monkeypatch.setattr(engine, "_next_logits", counted)
    engine._choice_cache.clear()
    engine.prefixes.clear()
    # the system prompt every agent sends: prefilled once per version (the prefix cache)
    system = "Frozen lake: walk to the goal; a hole ends the game. Reply with one move."
    asks = [
        (model, ChatRequest(
            model="x",
            messages=[
                {"role": "system", "content": system},
                {"role": "user", "content": f"State {k}: " + "far " * (3 * k) + "Move?"},
            ],
            guided_choice=moves,
            temperature=0.0,
        ))
        for k, model in enumerate([None, "p-v1", "p-v2"] * 3)
    ]  # fmt: skip
    outs = await asyncio.gather(*(engine.generate(m, r) for m, r in asks))
    assert [len(p) for p in passes] == [9]  # one pass (score_batch_size 32)
    assert len(set(passes[0])) == 3  # the base and both adapters in one pass
    ids = [engine.tokenizer(m, add_special_tokens=False)["input_ids"] for m in moves]
    for (model, _), out in zip(asks, outs, strict=True):
        alone = [s[0] for s in engine.score(model, out.prompt_token_ids, ids)]
        assert out.content == moves[max(range(4), key=alone.__getitem__)]
        assert out.token_logprobs == pytest.approx([max(alone)], abs=1e-4)
    assert not engine._inflight and not engine._to_score
    assert len(engine.prefixes.weight_keys()) == 3  # the system prompt's K/V, per version


def test_a_bad_choice_request_fails_alone(engine: Any) -> None:
    """Duplicate choices are the request's own 400; requests scored beside it are answered."""
    from agentrl.serving.errors import DeployError
    from agentrl.serving.openai_types import ChatRequest

    def ask(choices: list[str]) -> ChatRequest:
        msgs = [{"role": "user", "content": f"Pick one of {choices}."}]
        return ChatRequest(model="x", messages=msgs, guided_choice=choices, temperature=0.0)

    async def both() -> list[Any]:
        return await asyncio.gather(
            engine.generate(None, ask(["up", "up"])),
            engine.generate(None, ask(["up", "down"])),
            return_exceptions=True,
        )

    bad, good = asyncio.run(both())
    assert isinstance(bad, DeployError) and "duplicate" in str(bad)
    assert good.content in ("up", "down")
