"""The worker on agentrl.envs' real environments, with a tiny HF model and over HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.advantages import system_apply_gigpo_to_batch_steps
from agentrl.bench.testing_server import ScriptedOpenAIServer, ScriptedReply, tool_call
from agentrl.envs import make_env, task_for
from agentrl.llm.loading import load_smollm2_tokenizer, tiny_causal_lm
from agentrl.rollout import RLRolloutWorker, run_group
from agentrl.rollout.policies import HFAgentPolicy, OpenAIAgentPolicy, ScriptedPolicy


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    tokenizer = load_smollm2_tokenizer()
    return tiny_causal_lm(vocab_size=len(tokenizer), seed=2).eval(), tokenizer


async def test_sokoban_group_with_a_tiny_model_is_batched_and_trainable(
    tiny: tuple[Any, Any],
) -> None:
    model, tokenizer = tiny
    task = task_for("sokoban", seed=5, max_episode_steps=4)
    # A long max wait: the test checks grouping, not latency, on a busy machine.
    policy = HFAgentPolicy(model, tokenizer, max_new_tokens=6, max_batch_size=8, max_wait_ms=200)
    episodes = await run_group(task, 8, policy, env_factory=make_env, history_window=1)

    assert len({e.group_id for e in episodes}) == 1
    steps = [s for e in episodes for s in e.steps]
    assert all(e.critical_error is None for e in episodes)
    # Episodes run in lockstep, so every generate served the whole group.
    assert sum(policy.stats.batch_sizes) == len(steps)
    assert max(policy.stats.batch_sizes) == 8
    assert policy.stats.calls <= 4 + 1
    start_grid = episodes[0].steps[0].observation_data["anchor"]
    assert all(e.steps[0].observation_data["anchor"] == start_grid for e in episodes)
    for s in steps:
        lp = s.policy_logprobs
        assert lp is not None and len(lp["tokens"]) == len(lp["token_logprobs"]) >= 1
        prompt = tokenizer.decode(lp["prompt_ids"])
        assert prompt.startswith("<|im_start|>system\nYou are playing Sokoban")
        assert prompt.endswith("<|im_start|>assistant\n")
        assert s.raw_policy_output == tokenizer.decode(lp["tokens"], skip_special_tokens=True)
        assert "invalid_action" in s.step_info
    # What the trainer does next works on these steps.
    scores = [1.0 if e.success else 0.0 for e in episodes]
    system_apply_gigpo_to_batch_steps([e.steps for e in episodes], scores, omega=0.5, gamma=0.95)
    assert all(s.advantage is not None and s.return_to_go is not None for s in steps)


async def test_sokoban_expert_plan_solves_and_history_window_bounds_the_prompt() -> None:
    task = task_for("sokoban", seed=11)
    env = make_env("sokoban")
    env.reset(task.seed)
    plan = env.optimal_plan()  # type: ignore[attr-defined]
    assert plan
    policy = ScriptedPolicy([f"I will go <action>{m}</action>" for m in plan], action_format="text")
    worker = RLRolloutWorker(task, policy, make_env, history_window=1)
    episode = await worker.run()
    assert episode.success and episode.termination_reason == "env_done"
    assert len(episode.steps) == len(plan)
    sizes = [len(s.observation_data["messages"]) for s in episode.steps]
    assert max(sizes) <= 2 + 2  # system + first grid + one past turn
    # Anchors are the grids: the last anchor differs from the start.
    assert (
        episode.steps[0].observation_data["anchor"] != episode.steps[-1].observation_data["anchor"]
    )


async def test_tooluse_over_http_with_calculator_code_and_answer() -> None:
    """An OpenAI-compatible server drives the tool-use environment: a native tool call to
    the calculator, an Agent Zero JSON code_exe run in the real sandbox, then the answer."""
    task = task_for("tooluse-arithmetic", seed=4)
    env = make_env("tooluse-arithmetic")
    env.reset(task.seed)
    expr = env.task.spec["expression"]  # type: ignore[attr-defined]  # the question's sum
    answer = str(task.ground_truth)
    code = json.dumps(
        {"thoughts": ["check"], "headline": "verify", "tool_name": "code_exe",
         "tool_args": {"code": f"print({expr})"}}
    )  # fmt: skip
    final = json.dumps(
        {"thoughts": ["done"], "tool_name": "response", "tool_args": {"text": answer}}
    )
    script = [
        ScriptedReply(tool_calls=[tool_call("calculator", {"expression": expr}, "c1")]),
        ScriptedReply(content=f"Let me double check.\n```json\n{code}\n```"),
        ScriptedReply(content=final),
    ]
    with ScriptedOpenAIServer(script) as server:
        policy = OpenAIAgentPolicy("scripted", base_url=server.base_url)
        steps, messages, truth = await RLRolloutWorker(task, policy, make_env).run_episode()
        requests = server.requests
    assert truth == task.ground_truth
    assert [s.action_taken["name"] for s in steps] == ["calculator", "code_exe", "response"]
    assert steps[0].step_info["tool_name"] == "calculator"
    assert answer in messages[3].content  # the tool message with the calculator's result
    assert messages[3].role == "tool" and messages[3].tool_call_id == "c1"
    assert f"stdout:\n{answer}" in messages[5].content  # the sandbox really ran the code
    assert steps[-1].step_info["success"] is True and steps[-1].base_reward == 1.0
    assert steps[-1].step_info["termination_reason"] == "env_done"
    # Every request offered the environment's tools.
    assert all(
        [t["function"]["name"] for t in r["tools"]] == ["calculator", "code_exe", "response"]
        for r in requests
    )
