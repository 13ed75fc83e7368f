"""Pure cores: the sticky split (accuracy over 10,000 sessions, stickiness, a growing canary
only takes sessions from live), the anytime-valid test (false failures stay under alpha even
when peeked at every step), guided-choice renormalisation, the TensorZero export and the
agent-side handler."""

from __future__ import annotations

import random
import tomllib

import pytest

from agentrl.release.agent import handle_model_deployment, tensorzero_experimentation
from agentrl.release.sequential import compare, confidence_sequence
from agentrl.serving.choices import pick, renormalise
from agentrl.serving.config import RolloutPlan
from agentrl.serving.split import choose

SESSIONS = [f"session-{i}" for i in range(10_000)]


@pytest.mark.parametrize(
    "weights",
    [{"new": 10.0, "live": 90.0}, {"new": 25.0, "live": 75.0}, {"a": 50.0, "b": 30.0, "c": 20.0}],
)
def test_split_accuracy_and_stickiness(weights: dict[str, float]) -> None:
    order = list(weights)
    first = {s: choose(weights, order, s, "pub") for s in SESSIONS}
    for v, w in weights.items():
        share = sum(1 for x in first.values() if x == v) / len(SESSIONS)
        assert abs(share - w / 100) <= 0.02, (v, share)
    again = {s: choose(weights, order, s, "pub") for s in SESSIONS}
    assert again == first  # 100 % sticky


def test_growing_canary_only_takes_sessions_from_live() -> None:
    before = {s: choose({"new": 10, "live": 90}, ["new", "live"], s) for s in SESSIONS}
    after = {s: choose({"new": 25, "live": 75}, ["new", "live"], s) for s in SESSIONS}
    assert all(after[s] == "new" for s in SESSIONS if before[s] == "new")
    with pytest.raises(ValueError):
        choose({"a": 0.0}, ["a"], "s")


def test_confidence_sequence_error_rate_under_peeking() -> None:
    """Equal versions, looked at after every 10 samples up to 500: false 'fail' <= alpha."""
    rng = random.Random(7)
    alpha, runs, false_fail = 0.05, 300, 0
    for _ in range(runs):
        a = b = 0.0
        for n in range(1, 501):
            a += rng.random() < 0.2
            b += rng.random() < 0.2
            if n % 10 == 0:
                r = compare(
                    "error_rate",
                    (n, a),
                    (n, b),
                    lo=0,
                    hi=1,
                    higher_is_better=False,
                    tolerance=0.0,
                    alpha=alpha,
                    min_samples=10,
                )
                if r.verdict == "fail":
                    false_fail += 1
                    break
    assert false_fail / runs <= alpha


def test_compare_decides_clear_cases_and_waits_for_samples() -> None:
    worse = compare(
        "mean_reward",
        (80, 80 * 0.1),
        (80, 80 * 0.9),
        lo=0,
        hi=1,
        higher_is_better=True,
        tolerance=0.1,
        min_samples=20,
    )
    assert worse.verdict == "fail" and worse.diff_upper < -0.1
    few = compare(
        "mean_reward",
        (5, 0.5),
        (5, 4.5),
        lo=0,
        hi=1,
        higher_is_better=True,
        tolerance=0.1,
        min_samples=20,
    )
    assert few.verdict == "inconclusive" and "too few" in few.reason
    same = compare(
        "mean_reward",
        (5000, 2500.0),
        (5000, 2500.0),
        lo=0,
        hi=1,
        higher_is_better=True,
        tolerance=0.1,
        min_samples=20,
    )
    assert same.verdict == "pass"
    iv = confidence_sequence(100, 50.0, 0, 1, 0.025, 20)
    assert iv.lower < 0.5 < iv.upper and 0 < iv.upper - iv.lower < 1
    assert same.to_dict()["new"]["n"] == 5000


def test_guided_choice_renormalisation() -> None:
    probs = renormalise([-1.0, -2.0, -3.0])
    assert sum(probs) == pytest.approx(1.0) and probs[0] > probs[1] > probs[2]
    assert pick([-3.0, -1.0], 0.0)[0] == 1
    draws = [pick([-0.7, -0.7], 1.0, random.Random(i))[0] for i in range(2000)]
    assert 0.45 < sum(draws) / 2000 < 0.55


def test_plans_and_refusals() -> None:
    assert [s.weight for s in RolloutPlan.default("canary").steps] == [10, 25, 50, 100]
    assert [s.weight for s in RolloutPlan.default("blue_green").steps] == [0, 100]
    assert [s.weight for s in RolloutPlan.default("immediate").steps] == [100]
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        RolloutPlan.default("canary", ramp=(10, 150))


def test_tensorzero_export_is_valid_toml() -> None:
    text = tensorzero_experimentation("agent", {"v1": 90.0, "v2": 10.0, "old": 0.0})
    cfg = tomllib.loads(text)["functions"]["agent"]["experimentation"]
    assert cfg["type"] == "static_weights"
    assert cfg["candidate_variants"] == {"v1": 0.9, "v2": 0.1}


async def test_handle_model_deployment() -> None:
    from agentrl.release.actions import build_event
    from agentrl.serving.registry import ModelRecord

    rec = ModelRecord(
        model_id="p-v3", version=3, public_name="p", base_model="smollm2", checkpoint_path="/c"
    )
    switched: list[str] = []

    async def update(model: str) -> None:
        switched.append(model)

    canary = build_event(
        rec,
        public_name="p",
        endpoint="http://x",
        weight=10,
        strategy="canary",
        action="step",
        reason="r",
    )
    assert await handle_model_deployment(canary.to_json(), update) is None and switched == []
    now = build_event(
        rec,
        public_name="p",
        endpoint="http://x",
        weight=100,
        strategy="immediate",
        action="step",
        reason="r",
    )
    assert await handle_model_deployment(now.model_dump(mode="json"), update) == "p-v3"
    assert switched == ["p-v3"]
