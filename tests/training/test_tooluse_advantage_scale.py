"""The tool-use loop's job advantages with partial credit (issue 52): a group of four
failures that differ only by a little partial credit must not be pushed harder than a group
where one attempt succeeded. GRPO's division by the group's std made a 0.17 difference of
partial credit into advantages as large as a success's; the loop's jobs scale advantages by
the reward difference itself (`advantage_scale: none`, Dr. GRPO)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.app import loop_tooluse
from agentrl.app.loop_config import LoopConfig
from agentrl.training.dataset import Record
from agentrl.training.samples import build_samples


def record(tid: str, task: str, turn_rewards: list[float], question: str) -> Record:
    """A two-turn tool-use trajectory (a call, then an answer) and its reward with per-turn
    rewards, as the reward service writes them with partial credit on."""
    traj = {
        "trajectory_id": tid,
        "end_timestamp": f"2026-01-01T00:00:{tid[-2:]}Z",
        "task_context": {"task_id": task, "instructions": question},
        "turns": [
            {
                "turn_id": 1,
                "observation": {"type": "user_message", "content": question},
                "action": {"type": "tool_call", "raw_response": f'{{"tool_name": "calculator", "k": "{tid}"}}'},
            },
            {
                "turn_id": 2,
                "observation": {"type": "tool_result", "content": f"result of {tid}"},
                "action": {"type": "response", "raw_response": f'{{"tool_name": "response", "k": "{tid}"}}'},
            },
        ],
    }  # fmt: skip
    reward = {
        "trajectory_id": tid,
        "total_reward": sum(turn_rewards),
        "metadata": {"turn_rewards": turn_rewards},
    }
    return Record(traj, reward)


def groups() -> list[Record]:
    """Task a: one success (1.0), three failures with 0.17 of partial credit each; task b:
    four failures, one with 0.33 of partial credit (its tool result held a needed value),
    three with 0.17."""
    fail = [0.083, 0.083]
    recs = [record("t-00", "a", [0.0, 1.0], "What is 2 + 3?")]
    recs += [record(f"t-0{k}", "a", fail, "What is 2 + 3?") for k in (1, 2, 3)]
    recs += [record("t-04", "b", [0.25, 0.083], "What is 7 * 6?")]
    recs += [record(f"t-0{k}", "b", fail, "What is 7 * 6?") for k in (5, 6, 7)]
    return recs


def loop_scale() -> str:
    """The advantage scale the tool-use loop's jobs are given (their hyperparameters)."""
    env = loop_tooluse.environment(LoopConfig.tooluse())
    return str(json.loads(env["AGENTRL_TRAINING_HYPERPARAMETERS"]).get("advantage_scale", "std"))


def advantages(tokenizer: Any, scale: str) -> dict[str, list[float]]:
    samples, _ = build_samples(groups(), tokenizer, estimator="gigpo", advantage_scale=scale)
    out: dict[str, list[float]] = {}
    for s in sorted(samples, key=lambda s: (s.episode_id, s.step_index)):
        out.setdefault(s.episode_id, []).append(s.advantage)
    return out


def test_a_group_of_failures_is_pushed_less_than_a_success_in_the_loops_jobs(
    tokenizer: Any,
) -> None:
    adv = advantages(tokenizer, loop_scale())
    success = max(adv["t-00"])
    best_failure = max(abs(a) for k in ("t-04", "t-05", "t-06", "t-07") for a in adv[k])
    assert success > 0 and best_failure > 0  # the all-fail group still has a gradient
    assert best_failure < 0.5 * success, adv
    # and the failure that earned more partial credit is still preferred in its group
    assert min(adv["t-04"]) > 0 > max(adv["t-05"])


def test_the_std_scale_makes_partial_credit_as_strong_as_success(tokenizer: Any) -> None:
    """What the loop's jobs did before: the std of a group of failures is small, so its
    advantages are as large as those of a group with a success."""
    adv = advantages(tokenizer, "std")
    assert max(adv["t-04"]) >= 0.99 * max(adv["t-00"]), adv


def test_an_unknown_scale_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="advantage_scale"):
        build_samples(groups(), tokenizer, estimator="gigpo", advantage_scale="batch")
