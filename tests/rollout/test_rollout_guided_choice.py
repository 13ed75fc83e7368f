"""guided_choice + logprobs/top_logprobs through the official openai SDK and real HTTP, the
valid-action ChoicePolicy, and the completion id / serving model kept per step."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from openai import AsyncOpenAI

from agentrl.bench.testing_server import (
    ScriptedOpenAIServer,
    ScriptedReply,
    choice_responder,
)
from agentrl.llm.choices import score_choices
from agentrl.llm.loading import load_policy
from agentrl.rollout.policies import OpenAIAgentPolicy
from agentrl.rollout.policies.choice_policy import ChoicePolicy

MOVES = ["up", "down", "left", "right"]
MESSAGES = [{"role": "user", "content": "You are at row 0, column 0. Your move?"}]


@pytest.fixture(scope="module")
def tiny() -> object:
    return load_policy("tiny", seed=3)


def test_guided_choice_answers_with_the_best_choice_and_its_top_logprobs(tiny: object) -> None:
    pm = tiny
    want = score_choices(pm.model, pm.tokenizer, [MESSAGES], MOVES)[0]  # type: ignore[attr-defined]

    async def ask(base_url: str) -> object:
        client = AsyncOpenAI(base_url=base_url, api_key="x")
        return await client.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            logprobs=True,
            top_logprobs=4,
            temperature=0,
            extra_body={"guided_choice": MOVES},
        )

    responder = choice_responder(pm.model, pm.tokenizer)  # type: ignore[attr-defined]
    with ScriptedOpenAIServer(responder=responder) as server:
        resp = asyncio.run(ask(server.base_url))
    best = max(range(4), key=lambda i: want[i])
    choice = resp.choices[0]  # type: ignore[attr-defined]
    assert choice.message.content == MOVES[best]
    lp = choice.logprobs.content[0]
    assert lp.logprob == pytest.approx(want[best], abs=1e-6)
    tops = {t.token: t.logprob for t in lp.top_logprobs}
    assert set(tops) == set(MOVES)
    assert sum(math.exp(v) for v in tops.values()) == pytest.approx(1.0, abs=1e-5)
    assert resp.id.startswith("chatcmpl-")  # type: ignore[attr-defined]


def test_bad_guided_choice_is_a_clear_400() -> None:
    with ScriptedOpenAIServer([ScriptedReply(content="up")]) as server:
        for bad in ([], ["up", "up"], "up", [1, 2]):
            r = httpx.post(
                f"{server.base_url}/chat/completions",
                json={"model": "m", "messages": MESSAGES, "guided_choice": bad},
            )
            assert r.status_code == 400
            assert "guided_choice" in r.json()["error"]["message"]
        # A scripted reply outside the choices is refused, never passed off as valid.
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": "m", "messages": MESSAGES, "guided_choice": ["down", "left"]},
        )
        assert r.status_code == 400


def test_openai_policy_sends_guided_choice_and_keeps_id_and_model() -> None:
    reply = ScriptedReply(
        content="left",
        logprobs=[-0.2],
        logprob_tokens=["left"],
        top_logprobs=[{"left": -0.2, "up": -1.9}],
    )
    with ScriptedOpenAIServer([reply], model="agentrl-policy@v3") as server:
        policy = OpenAIAgentPolicy(
            "agentrl-policy@v3",
            base_url=server.base_url,
            guided_choice=lambda obs: MOVES,
            top_logprobs=2,
        )
        action, raw, lp, _ = asyncio.run(policy.get_action(MESSAGES))
        body = server.requests[0]
    assert body["guided_choice"] == MOVES
    assert body["top_logprobs"] == 2
    assert action == {"type": "text", "content": "left"} or action.get("content") == "left"
    assert raw == "left"
    assert lp is not None
    assert lp["completion_id"].startswith("chatcmpl-")
    assert lp["model"] == "agentrl-policy@v3"
    assert lp["top_logprobs"] == [{"left": -0.2, "up": -1.9}]


def test_openai_policy_keeps_id_and_model_without_logprobs() -> None:
    with ScriptedOpenAIServer([ScriptedReply(content="up")], model="v7") as server:
        policy = OpenAIAgentPolicy("v7", base_url=server.base_url, logprobs=False)
        _, _, lp, _ = asyncio.run(policy.get_action(MESSAGES))
    assert lp is not None and lp["model"] == "v7" and "completion_id" in lp


def test_choice_policy_scores_once_per_prompt_and_never_acts_invalidly(tiny: object) -> None:
    pm = tiny
    policy = ChoicePolicy(pm.model, pm.tokenizer, MOVES, temperature=1.0, seed=0)  # type: ignore[attr-defined]
    outs = [asyncio.run(policy.get_action(MESSAGES)) for _ in range(6)]
    assert policy.scored == 1 and policy.calls == 6
    for action, raw, lp, _ in outs:
        assert raw in MOVES and action["content"] == raw
        assert lp is not None
        assert sum(math.exp(v) for v in lp["choice_logprobs"]) == pytest.approx(1.0, abs=1e-5)
        assert lp["logprob"] == lp["choice_logprobs"][lp["chosen"]]
    policy.new_version()
    asyncio.run(policy.get_action(MESSAGES))
    assert policy.scored == 2


def test_choice_policy_batches_concurrent_episodes_and_scores_each_prompt_once(
    tiny: object,
) -> None:
    """30 concurrent episodes reaching 5 distinct prompts: each prompt scored once (no two
    threads score the same prompt), with the scores a lone call gets."""
    pm = tiny
    prompts = [
        [{"role": "user", "content": f"You are at row {r}, column 1. Move?"}] for r in range(5)
    ]
    policy = ChoicePolicy(pm.model, pm.tokenizer, MOVES, temperature=0.0)  # type: ignore[attr-defined]

    async def many() -> list[object]:
        return await asyncio.gather(*(policy.get_action(prompts[i % 5]) for i in range(30)))

    outs = asyncio.run(many())
    assert policy.scored == 5 and policy.calls == 30
    for i, (_, _, lp, _) in enumerate(outs):
        alone = score_choices(pm.model, pm.tokenizer, [prompts[i % 5]], MOVES)[0]  # type: ignore[attr-defined]
        assert lp["choice_logprobs"] == pytest.approx(alone, abs=1e-4)
