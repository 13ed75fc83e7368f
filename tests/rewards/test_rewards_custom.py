"""@reward_function: the decorator API, checked outputs, errors recorded (never raised), YAML
configuration as weighted components, dense step rewards."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.core.errors import ConfigError
from agentrl.rewards import EvaluateResult, MetricResult, RewardConfig, StepOutput, reward_function
from agentrl.rewards.custom import REGISTRY, RewardFunctionError, resolve, trajectory_messages
from agentrl.rewards.pipeline import Failure, score_payloads


@reward_function
def answer_given(
    messages: list[dict[str, Any]], ground_truth: Any = None, **kwargs: Any
) -> EvaluateResult:
    last = messages[-1].get("content") or ""
    hit = ground_truth is not None and str(ground_truth) in last
    return EvaluateResult(
        score=1.0 if hit else 0.0,
        reason="answer in the final message" if hit else "answer missing",
        metrics={"exact": MetricResult(score=1.0 if hit else 0.0, success=hit, reason="substring")},
    )


@reward_function(name="per_step_async")
async def per_step(
    messages: list[dict[str, Any]], ground_truth: Any = None, **kwargs: Any
) -> EvaluateResult:
    await asyncio.sleep(0)
    assistant = [m for m in messages if m["role"] == "assistant"]
    steps = [StepOutput(step_index=i, base_reward=0.1 * i) for i in range(len(assistant))]
    return EvaluateResult(score=0.5, reason="dense", step_outputs=steps)


def test_decorator_registers_and_calls_through() -> None:
    assert REGISTRY["answer_given"] is answer_given and REGISTRY["per_step_async"] is per_step
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "it is 4"}]
    assert answer_given(msgs, ground_truth=4).score == 1.0
    assert answer_given(messages=msgs, ground_truth=5).score == 0.0
    res = asyncio.run(per_step(msgs))
    assert res.step_outputs is not None and [s.base_reward for s in res.step_outputs] == [0.0]
    assert (
        answer_given.__name__ == "answer_given" and not answer_given.is_async and per_step.is_async
    )


@pytest.mark.parametrize(
    ("returned", "want"),
    [(0.25, 0.25), (1, 1.0), ((0.5, {"m": 0.2}), 0.5), ({"score": 0.75, "reason": "dict"}, 0.75)],
)
def test_legacy_and_plain_returns_are_accepted(returned: Any, want: float) -> None:
    fn = reward_function(lambda messages, ground_truth=None, **kw: returned, name="tmp_plain")
    assert asyncio.run(fn.evaluate([], None)).score == want


@pytest.mark.parametrize(
    ("returned", "needle"),
    [
        (1.5, "outside [0, 1]"),
        (float("nan"), "outside [0, 1]"),
        (True, "returned a bool"),
        ("good", "returned str"),
        ({"score": "high"}, "invalid result"),
        (EvaluateResult(score=0.3, error="model offline"), "model offline"),
        (
            EvaluateResult(
                score=0.3, step_outputs=[StepOutput(step_index=0, base_reward=float("inf"))]
            ),
            "non-finite",
        ),
    ],
)
def test_bad_returns_become_errors_not_exceptions(returned: Any, needle: str) -> None:
    fn = reward_function(lambda messages, ground_truth=None, **kw: returned, name="tmp_bad")
    res = asyncio.run(fn.evaluate([], None))
    assert res.error is not None and needle in res.error and "tmp_bad" in res.error
    assert not res.is_score_valid
    with pytest.raises(RewardFunctionError):
        fn([])  # calling it directly raises, so a user testing their function sees the problem


def test_raising_and_slow_functions_become_errors() -> None:
    def boom(messages: Any, ground_truth: Any = None, **kw: Any) -> EvaluateResult:
        raise KeyError("missing field")

    async def slow(messages: Any, ground_truth: Any = None, **kw: Any) -> EvaluateResult:
        await asyncio.sleep(5)
        return EvaluateResult(score=1.0)

    res = asyncio.run(reward_function(boom, name="tmp_boom").evaluate([], None))
    assert res.error == "reward function 'tmp_boom' raised KeyError: 'missing field'"
    res = asyncio.run(reward_function(slow, name="tmp_slow").evaluate([], None, timeout=0.05))
    assert res.error is not None and "timed out after 0.05s" in res.error


def test_resolve_imports_the_module_named_in_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_rewards_mod.py").write_text(
        textwrap.dedent(
            """
            from agentrl.rewards import reward_function

            @reward_function
            def brevity(messages, ground_truth=None, **kwargs):
                return 1.0 if len(messages) <= 4 else 0.5

            def plain(messages, ground_truth=None, **kwargs):
                return 0.9
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert resolve("brevity", "my_rewards_mod").name == "brevity"
        assert resolve("plainly", "my_rewards_mod:plain")([]).score == 0.9
        with pytest.raises(ConfigError, match="no reward function named 'nope'"):
            resolve("nope")
        with pytest.raises(ConfigError, match="cannot import"):
            resolve("x", "no_such_module_here")
    finally:
        sys.modules.pop("my_rewards_mod", None)
        REGISTRY.pop("brevity", None)
        REGISTRY.pop("plainly", None)


def test_trajectory_as_openai_messages() -> None:
    doc = sample_trajectory(3, turns=3)
    msgs = trajectory_messages(TrajectoryEvent.model_validate(doc))
    roles = [m["role"] for m in msgs]
    assert roles[0] == "user" and msgs[0]["content"] == doc["turns"][0]["observation"]["content"]
    assert roles.count("assistant") == 3
    calls = [m for m in msgs if m.get("tool_calls")]
    for call in calls:
        nxt = msgs[msgs.index(call) + 1]
        assert nxt["role"] == "tool" and nxt["tool_call_id"] == call["tool_calls"][0]["id"]
    assert msgs[-1]["role"] == "assistant" and "Done" in msgs[-1]["content"]


def write_config(tmp_path: Path, body: str) -> RewardConfig:
    p = tmp_path / "rewards.yaml"
    p.write_text(textwrap.dedent(body))
    return RewardConfig.load(p)


def test_custom_functions_are_weighted_components_configured_in_yaml(tmp_path: Path) -> None:
    @reward_function(name="always_broken")
    def broken(messages: Any, ground_truth: Any = None, **kw: Any) -> float:
        raise RuntimeError("contact admin@example.com")  # errors are redacted too

    cfg = write_config(
        tmp_path,
        """
        weights: {task_completion: 0.4, efficiency: 0.2, code_quality: 0.15, user_feedback: 0.25, answer_given: 0.5}
        custom_functions:
          - {name: answer_given, weight: 0.3}
          - {name: per_step_async, weight: 0.1}
          - {name: always_broken, weight: 0.2}
        """,
    )
    doc = sample_trajectory(5, status="completed_successfully", feedback="thumbs_up")
    doc["task_context"]["ground_truth"] = "15"  # "Done: the total for task 5 is 15."
    (scored,), _ = asyncio.run(score_payloads([doc], cfg))
    assert not isinstance(scored, Failure)
    r = scored.event
    comps = r.reward_components
    assert (
        comps["answer_given"].score == 1.0 and comps["answer_given"].weight == 0.5
    )  # weights: wins
    assert comps["answer_given"].source == "automated"  # the schema's value
    assert (comps["answer_given"].model_extra or {})["source_kind"] == "custom"
    assert comps["per_step_async"].weight == 0.1
    assert "always_broken" not in comps
    assert r.metadata is not None and r.metadata.model_extra is not None
    errors = r.metadata.model_extra["errors"]
    assert errors == [
        {
            "component": "always_broken",
            "error": "reward function 'always_broken' raised RuntimeError: contact [REDACTED:EMAIL]",
        }
    ]
    assert r.reward_type == "dense"
    steps = (r.step_rewards or {})["per_step_async"]
    assert [s["base_reward"] for s in steps] == pytest.approx([0.1 * i for i in range(len(steps))])
    # raw total over the components that apply (the broken one counts as missing)
    w = {
        "task_completion": 0.4,
        "efficiency": 0.2,
        "user_feedback": 0.25,
        "answer_given": 0.5,
        "per_step_async": 0.1,
    }
    want = sum(comps[n].score * w[n] for n in w) / sum(w.values())
    assert r.raw_total_reward == pytest.approx(want)
    REGISTRY.pop("always_broken", None)


def test_config_validation(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be >= 0"):
        write_config(tmp_path, "weights: {task_completion: -1}")
    with pytest.raises(ConfigError, match="not built-in"):
        write_config(tmp_path, "custom_functions: [{name: efficiency}]")
    with pytest.raises(ConfigError, match="extra"):
        write_config(tmp_path, "wieghts: {}")
    a, b = RewardConfig(), RewardConfig(window=500)
    assert a.calculator_version != b.calculator_version
    assert a.calculator_version == RewardConfig().calculator_version
    assert (
        RewardConfig(opt_out_users=["u"]).calculator_version == a.calculator_version
    )  # not a scoring setting


def test_sync_function_timeout_is_enforced_and_the_loop_keeps_running() -> None:
    """A 2 s sync function with a 0.1 s timeout: the call returns after about the timeout,
    the event loop keeps ticking meanwhile (acks and heartbeats would go out), the worker is
    killed, the timeout is counted, and the next call gets a fresh worker."""
    import os
    import time

    def sleepy(messages: Any, ground_truth: Any = None, **kw: Any) -> EvaluateResult:
        if kw.get("pid"):
            return EvaluateResult(score=1.0, reason=str(os.getpid()))
        time.sleep(2.0)
        return EvaluateResult(score=1.0)

    fn = reward_function(sleepy, name="tmp_sleepy")

    async def main() -> tuple[EvaluateResult, float, int, EvaluateResult]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        t0 = time.perf_counter()
        res = await fn.evaluate([], None, timeout=0.1)
        took = time.perf_counter() - t0
        stop.set()
        await tick_task
        after = await fn.evaluate([], None, timeout=5.0, pid=True)
        return res, took, ticks, after

    try:
        res, took, ticks, after = asyncio.run(main())
    finally:
        fn.close()
    assert res.error is not None and "timed out after 0.1s" in res.error
    assert took < 1.5, f"the call took {took:.2f}s: the timeout was not enforced"
    assert ticks >= 5, "the event loop was frozen during the call"
    assert fn.stats["timeouts"] == 1
    assert after.error is None and after.score == 1.0  # a fresh worker answered
    assert int(after.reason or 0) != os.getpid()  # ... in another process


def test_reward_json_is_pydantics_encoding_also_for_values_orjson_cannot_take() -> None:
    """The reward bytes come from orjson (faster); custom metrics may carry values only
    pydantic encodes (a set, a Decimal): those go through pydantic's rules, and plain
    payloads give the very bytes pydantic's encoder gives."""
    import datetime as dt
    from decimal import Decimal

    import pydantic_core

    @reward_function(name="odd_metrics")
    def odd(messages: Any, ground_truth: Any = None, **kw: Any) -> EvaluateResult:
        return EvaluateResult(
            score=0.5,
            metrics={
                "m": MetricResult(
                    score=0.5,
                    reason="odd",
                    extra={"tags": {"a"}, "at": dt.date(2026, 1, 2), "d": Decimal("1.5")},
                )
            },
        )

    cfg = RewardConfig(custom_functions=[{"name": "odd_metrics", "weight": 0.1}])
    docs = [sample_trajectory(i, pii=i == 3) for i in range(20)]
    results, _ = asyncio.run(score_payloads(docs, cfg))
    for r in results:
        assert not isinstance(r, Failure)
        assert r.to_json() == pydantic_core.to_json(r.payload)
        r.event  # noqa: B018 - the bytes still validate as a reward event
