"""Validation stops when its verdict is settled: the benchmark mean can no longer reach (or
fall below) the threshold, nor the regression bound against the live model, whatever the
episodes left do. The stop never changes a verdict: every way the remaining episodes could
end gives the verdict it stopped on."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

from agentrl.envs.tooluse.agent_prompt import SYSTEM_PROMPT, response_schema
from agentrl.release.validation import (
    Validator,
    benchmark_bounds,
    decide,
    recorded_bounds,
    regression_tolerance,
    settled_verdict,
)
from agentrl.serving.config import DeploySettings
from agentrl.serving.registry import ModelRecord
from deploy_helpers import TINY


def test_bounds_are_the_means_the_episodes_left_can_still_give() -> None:
    # 3 types of 4: (successes, played, planned)
    tally = {"a": (2, 3, 4), "b": (0, 4, 4), "c": (1, 1, 4)}
    lo, hi = benchmark_bounds(tally)
    assert abs(lo - (2 / 4 + 0 + 1 / 4) / 3) < 1e-12
    assert abs(hi - (3 / 4 + 0 + 4 / 4) / 3) < 1e-12
    done = {"a": (3, 4, 4)}
    assert benchmark_bounds(done) == (0.75, 0.75)


def test_verdicts_settle_only_when_no_ending_can_change_them() -> None:
    tol = 1 / 12
    # the live model at 0.5: a candidate certain of >= 0.5 - tol passes, one that cannot
    # reach it fails, one in between plays on
    assert settled_verdict((0.45, 0.9), (0.5, 0.5), 0.0, tol) == "pass"
    assert settled_verdict((0.1, 0.4), (0.5, 0.5), 0.0, tol) == "fail"
    assert settled_verdict((0.3, 0.6), (0.5, 0.5), 0.0, tol) is None
    # the live model still playing: the candidate's worst against its best, and so on
    assert settled_verdict((0.45, 0.9), (0.4, 0.6), 0.0, tol) is None
    assert settled_verdict((0.6, 0.9), (0.4, 0.6), 0.0, tol) == "pass"
    # the threshold alone (no live model)
    assert settled_verdict((0.2, 0.9), None, 0.3, tol) is None
    assert settled_verdict((0.3, 0.9), None, 0.3, tol) == "pass"
    assert settled_verdict((0.0, 0.29), None, 0.3, tol) == "fail"
    # exactly one episode's worth below the live model still passes (decide's float slack)
    one_lost = (0.75 + 1.0 + 0.25) / 3
    live = (1.0 + 1.0 + 0.25) / 3
    assert settled_verdict((one_lost, one_lost), (live, live), 0.0, tol) == "pass"


def _decide(mine: float, ref: float, s: DeploySettings, planned: dict[str, int]) -> bool:
    details = {"benchmark": {"mean": mine, "episodes": planned}, "safety": {}}
    live = {"benchmark": {"mean": ref, "episodes": planned}, "safety": {}}
    results, _ = decide(details, live, s)
    return bool(results["benchmark_passed"] and not results["performance_regression"])


def test_a_settled_verdict_is_the_one_every_ending_gives() -> None:
    """Every partial tally of a 3 x 4 benchmark against a finished live benchmark, every
    threshold of a few: where `settled_verdict` speaks, each way the episodes left can end
    gives its verdict under `decide`; and it speaks before the end often enough to pay."""
    planned = {"a": 4, "b": 4, "c": 4}
    early = 0
    for threshold, ref_mean in itertools.product((0.0, 0.5), (0.25, 0.5, 0.9)):
        s = DeploySettings(benchmark_threshold=threshold)
        tol = regression_tolerance({"episodes": planned}, s)
        per_type = [(w, p) for p in range(5) for w in range(p + 1)]
        for parts in itertools.product(per_type, repeat=3):
            tally = {t: (w, p, 4) for t, (w, p) in zip(planned, parts, strict=True)}
            verdict = settled_verdict(benchmark_bounds(tally), (ref_mean, ref_mean), threshold, tol)
            if verdict is None:
                continue
            left = [range(w, w + 4 - p + 1) for w, p in parts]
            if any(p < 4 for _, p in parts):
                early += 1
            for ends in itertools.product(*left):
                mean = sum(e / 4 for e in ends) / 3
                assert _decide(mean, ref_mean, s, planned) == (verdict == "pass"), (
                    tally,
                    ends,
                    threshold,
                    ref_mean,
                )
    assert early > 500


def test_an_early_stopped_record_keeps_its_bounds() -> None:
    assert recorded_bounds(None) is None
    assert recorded_bounds({"benchmark": {"mean": 0.4}}) == (0.4, 0.4)
    stopped = {"benchmark": {"mean": 0.4, "bounds": [0.25, 0.6], "stopped_early": True}}
    assert recorded_bounds(stopped) == (0.25, 0.6)
    rng = random.Random(0)
    for _ in range(200):  # the recorded rate is always within the recorded bounds
        tally = {}
        for t in "abc":
            p = rng.randint(1, 4)
            tally[t] = (rng.randint(0, p), p, 4)
        lo, hi = benchmark_bounds(tally)
        rate = sum(w / p for w, p, _ in tally.values()) / 3
        assert lo - 1e-12 <= rate <= hi + 1e-12


FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "agent_zero", "schema": response_schema(), "strict": True},
}


def _record(version: int, details: dict[str, Any] | None = None) -> ModelRecord:
    return ModelRecord(
        model_id=f"early-v{version}",
        public_name="early",
        version=version,
        base_model="tiny",
        serving={"base_spec": {"name": "tiny", "seed": 0, "tiny_kwargs": TINY}},
        validation_details=details or {},
    )


async def test_the_validator_stops_a_candidate_that_cannot_reach_the_live_model(
    tmp_path: Path,
) -> None:
    """A random tiny model (it never answers right) against a live model that solved every
    benchmark task: after a few failures the candidate cannot come within the regression
    bound, so the episodes still playing are cancelled and it fails as it would have."""
    settings = DeploySettings(
        benchmark_tasks={"tool_usage": ["tooluse-arithmetic"]},
        benchmark_env_kwargs={"tooluse-arithmetic": {"view": "agent_zero"}},
        benchmark_system_prompt=SYSTEM_PROMPT,
        benchmark_response_format=FORMAT,
        benchmark_max_tokens=8,
        benchmark_episodes=40,  # more than the engine's batch (32): some wait to start
        benchmark_max_steps=1,
        validation_max_new_tokens=4,
    )
    validator = Validator(settings, None, tmp_path, prompts={"refusal": []})
    live = _record(1, {"benchmark": {"mean": 1.0, "episodes": {"tool_usage": 40}}, "safety": {}})
    results, details = await validator(_record(2), live)
    assert results["performance_regression"] is True
    bench = details["benchmark"]
    assert bench["stopped_early"] is True
    assert bench["played"]["tool_usage"] < 40 and bench["scores"]["tool_usage"] == 0.0
    assert bench["bounds"][1] < 1.0 - regression_tolerance(bench, settings)
