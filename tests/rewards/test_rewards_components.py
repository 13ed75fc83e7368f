"""The seed's four components against hand-computed values, and the seed's worked example."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.trajectory import Outcome, TrajectoryEvent
from agentrl.rewards import RewardConfig, ScoringInput, score_batch, score_trajectory
from agentrl.rewards import components as C
from agentrl.rewards.window import TrailingWindow, WindowState


def traj(**kw: Any) -> TrajectoryEvent:
    return TrajectoryEvent.model_validate(sample_trajectory(7, **kw))


# ---- task completion ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "pct", "want"),
    [
        ("completed_successfully", 0.3, 1.0),
        ("partial_completion", 0.0, 0.5),
        ("partial_completion", 0.6, 0.8),
        ("partial_completion", 1.0, 1.0),
        ("failed", 0.9, 0.0),
    ],
)
def test_task_completion_values(status: str, pct: float, want: float) -> None:
    got = C.task_completion(Outcome(task_status=status, completion_percentage=pct))  # type: ignore[arg-type]
    assert got is not None
    assert got.score == pytest.approx(want)


def test_task_completion_without_outcome_is_not_applicable() -> None:
    assert C.task_completion(None) is None


# ---- efficiency --------------------------------------------------------------------------
def test_efficiency_seed_example_five_turns_against_seven() -> None:
    # "completed in 5 turns, avg is 7 turns": z = (7 - 5) / 2.5 = 0.8 -> (0.8 + 2) / 4 = 0.7
    assert C.efficiency_score(5, 7.0, 2.5) == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("turns", "mean", "std", "want"),
    [
        (1, 10, 1, 1.0),
        (30, 10, 1, 0.0),
        (10, 10, 3, 0.5),
        (13, 10, 3, 0.25),
        (4, 5, 0, 1.0),
        (5, 5, 0, 0.5),
    ],
)
def test_efficiency_caps_and_zero_std(turns: int, mean: float, std: float, want: float) -> None:
    assert C.efficiency_score(turns, mean, std) == pytest.approx(want)


def test_efficiency_is_neutral_and_uninformative_without_history() -> None:
    t = traj(turns=3)
    got = C.efficiency(t, history_count=2, mean_turns=9.0, std_turns=1.0, min_history=5)
    assert got.score == 0.5 and not got.informative
    got = C.efficiency(t, history_count=5, mean_turns=9.0, std_turns=3.0, min_history=5)
    assert got.score == pytest.approx((2.0 + 2.0) / 4.0) and got.informative


def test_efficiency_signals_count_redundant_tool_calls() -> None:
    doc = sample_trajectory(1, turns=5)
    for turn in doc["turns"][1:4]:  # three identical calls (args in a different key order)
        turn["action"] = {
            "type": "tool_call",
            "tool_name": "search",
            "tool_args": {"q": "x", "n": [1, {"a": 2}]},
        }
    doc["turns"][2]["action"]["tool_args"] = {"n": [1, {"a": 2}], "q": "x"}
    sig = C.efficiency_signals(TrajectoryEvent.model_validate(doc))
    assert sig["redundant_tool_calls"] == 2
    assert sig["turns"] == 5
    assert sig["wall_time_s"] == pytest.approx(25.0)
    assert sig["total_tokens"] == 2500


def test_efficiency_uses_running_per_domain_statistics() -> None:
    cfg = RewardConfig(efficiency_min_history=2)
    state = WindowState(turns={"coding": TrailingWindow(1000, np.array([4.0, 6.0, 8.0, 10.0]))})
    # coding history: mean 7, std sqrt(5); a 5-turn coding trajectory: z = 2 / sqrt(5)
    reward, new = score_trajectory(traj(domain="coding", turns=5), state, cfg)
    z = 2 / np.sqrt(5)
    assert reward.reward_components["efficiency"].score == pytest.approx((z + 2) / 4)
    assert new.turns["coding"].values.tolist() == [4.0, 6.0, 8.0, 10.0, 5.0]
    # another domain has no history: neutral
    reward, _ = score_trajectory(traj(domain="research", turns=5), state, cfg)
    assert reward.reward_components["efficiency"].score == 0.5


# ---- code quality ------------------------------------------------------------------------
def test_code_quality_not_applicable_without_code() -> None:
    assert C.code_quality(C.CodeEvidence(contains_code=False, lint_score=10)) is None


@pytest.mark.parametrize(
    ("evidence", "want"),
    [
        (C.CodeEvidence(True, lint_score=8.5), 0.85),
        (C.CodeEvidence(True, tests_passed=3, tests_total=4), 0.75),
        (C.CodeEvidence(True, critical_issues=1), 0.5),
        (C.CodeEvidence(True, critical_issues=3), 0.0),  # 1 - 1.5 floored at 0
        (
            C.CodeEvidence(True, lint_score=8.0, tests_passed=1, tests_total=2, critical_issues=0),
            (0.8 + 0.5 + 1.0) / 3,
        ),
        (C.CodeEvidence(True), 0.5),  # code but nothing measurable: the seed's fallback
    ],
)
def test_code_quality_averages_what_is_available(evidence: C.CodeEvidence, want: float) -> None:
    got = C.code_quality(evidence)
    assert got is not None
    assert got.score == pytest.approx(want)
    assert got.source == "linter"


# ---- user feedback -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "want", "source"),
    [
        (C.FeedbackState(explicit="thumbs_up"), 1.0, "human"),
        (C.FeedbackState(explicit="thumbs_down"), 0.0, "human"),
        (C.FeedbackState(explicit="rating", rating=4), 0.8, "human"),
        (C.FeedbackState(explicit="rating", rating=1), 0.2, "human"),
        (C.FeedbackState(correction_requested=True), 0.2, "implicit"),
        (C.FeedbackState(task_abandoned=True), 0.0, "implicit"),
        (
            C.FeedbackState(correction_requested=True, explicit="thumbs_up"),
            1.0,
            "human",
        ),  # explicit wins
        (C.FeedbackState(), 0.5, "default"),
    ],
)
def test_user_feedback_values(state: C.FeedbackState, want: float, source: str) -> None:
    got = C.user_feedback(state)
    assert got.score == pytest.approx(want)
    assert got.source == source
    assert got.informative == (source != "default")


def test_feedback_state_folds_events_latest_explicit_wins() -> None:
    st = C.FeedbackState.from_outcome(
        Outcome(task_status="failed", user_feedback={"type": "thumbs_down"})
    )
    st.apply("rating", 5, "f1")
    st.apply("correction", None, "f2")
    assert C.user_feedback(st).score == 1.0
    assert st.correction_requested and st.feedback_ids == ["f1", "f2"]
    assert C.FeedbackState.from_dict(st.to_dict()) == st
    with pytest.raises(ValueError, match="unknown feedback type"):
        st.apply("meh")


# ---- the seed's worked example -----------------------------------------------------------
def seed_example_input() -> tuple[ScoringInput, WindowState]:
    """Inputs that give exactly the seed's component scores 0.9 / 0.7 / 0.85 / 1.0."""
    doc = sample_trajectory(
        1, domain="coding", turns=5, status="partial_completion", feedback="thumbs_up"
    )
    doc["metadata"]["outcome"]["completion_percentage"] = 0.8  # 0.5 + 0.5 x 0.8 = 0.9
    item = ScoringInput(
        TrajectoryEvent.model_validate(doc),
        code=C.CodeEvidence(contains_code=True, lint_score=8.5),  # "pylint score 8.5/10"
    )
    # coding history with mean 7 and std 2.5 ("avg is 7 turns"): 5 turns -> 0.7
    state = WindowState(turns={"coding": TrailingWindow(1000, np.array([4.5, 9.5] * 3))})
    return item, state


def test_seed_worked_example_total_is_0_8775_not_0_8625() -> None:
    item, state = seed_example_input()
    # The seed's formula (no completion scaling): its example is a partial completion.
    (scored,), _ = score_batch([item], state, RewardConfig(efficiency_by_completion=False))
    reward = scored.event
    comps = {name: (c.score, c.weight) for name, c in reward.reward_components.items()}
    assert comps == {
        "task_completion": (pytest.approx(0.9), 0.4),
        "efficiency": (pytest.approx(0.7), 0.2),
        "code_quality": (pytest.approx(0.85), 0.15),
        "user_feedback": (pytest.approx(1.0), 0.25),
    }
    # 0.9 x 0.4 + 0.7 x 0.2 + 0.85 x 0.15 + 1.0 x 0.25 = 0.36 + 0.14 + 0.1275 + 0.25
    assert reward.raw_total_reward == pytest.approx(0.8775)
    assert reward.total_reward == pytest.approx(0.8775)
    assert reward.total_reward != pytest.approx(0.8625)
    assert reward.total_reward_kind == "raw"
    assert reward.metadata is not None and reward.metadata.evaluation_method == "hybrid"
    assert reward.reward_components["user_feedback"].source == "human"
    assert reward.reward_components["code_quality"].source == "linter"


def test_total_reward_can_be_the_normalised_total() -> None:
    item, state = seed_example_input()
    (scored,), _ = score_batch(
        [item], state, RewardConfig(total_reward="normalized", efficiency_by_completion=False)
    )
    reward = scored.event
    assert reward.total_reward_kind == "normalized"
    assert reward.total_reward == reward.normalized_total_reward
    assert reward.raw_total_reward == pytest.approx(0.8775)
    # A first trajectory is its own window: every z-score is 0.
    assert reward.normalized_total_reward == pytest.approx(0.0)


def test_raw_total_renormalises_over_applicable_components() -> None:
    doc = sample_trajectory(2, status="completed_successfully", feedback="thumbs_down")
    (scored,), _ = score_batch(
        [ScoringInput(TrajectoryEvent.model_validate(doc))], WindowState(), RewardConfig()
    )
    r = scored.event
    assert "code_quality" not in r.reward_components
    assert r.metadata is not None and r.metadata.model_extra is not None
    assert r.metadata.model_extra["not_applicable"] == ["code_quality"]
    # (1.0 x 0.4 + 0.5 x 0.2 + 0.0 x 0.25) / (0.4 + 0.2 + 0.25); efficiency neutral (no history)
    assert r.raw_total_reward == pytest.approx(0.5 / 0.85)
    # efficiency (0.2) and no feedback... here feedback is explicit: only efficiency is a fallback
    assert r.metadata.confidence == pytest.approx((0.4 + 0.25) / 0.85, abs=1e-4)


def test_confidence_counts_a_failed_custom_function_and_leaves_partial_credit_out() -> None:
    """The confidence is the base total's: a custom function that failed still applies
    (its weight, uninformative, is in the denominator; it is an error, not "not applicable"),
    and partial credit's columns (a bonus beside the base total) count in neither part."""
    from agentrl.rewards import EvaluateResult
    from agentrl.rewards.config import CustomFunctionSpec, PartialCreditConfig

    doc = sample_trajectory(2, status="completed_successfully", feedback="thumbs_down")
    cfg = RewardConfig(
        custom_functions=[CustomFunctionSpec(name="judge", weight=0.3)],
        partial_credit=PartialCreditConfig(),
    )
    item = ScoringInput(
        TrajectoryEvent.model_validate(doc),
        custom={"judge": EvaluateResult(score=0.9, error="judge offline")},
    )
    (scored,), _ = score_batch([item], WindowState(), cfg)
    meta = scored.payload["metadata"]
    assert meta["errors"] == [{"component": "judge", "error": "judge offline"}]
    assert "judge" not in meta["not_applicable"] and "code_quality" in meta["not_applicable"]
    # informative: task completion and the explicit feedback; applicable: those, efficiency
    # (no history yet: uninformative) and the failed judge
    weights = cfg.component_weights()
    informative = weights["task_completion"] + weights["user_feedback"]
    applicable = informative + weights["efficiency"] + 0.3
    assert meta["confidence"] == pytest.approx(informative / applicable, abs=1e-4)


def test_configured_weights_are_used() -> None:
    item, state = seed_example_input()
    cfg = RewardConfig(
        weights={
            "task_completion": 1.0,
            "efficiency": 0.0,
            "code_quality": 0.0,
            "user_feedback": 1.0,
        }
    )
    (scored,), _ = score_batch([item], state, cfg)
    assert scored.event.raw_total_reward == pytest.approx((0.9 + 1.0) / 2)
    assert scored.event.reward_components["efficiency"].weight == 0.0


def test_reward_is_attributed_to_the_serving_model_version() -> None:
    """The cross-team contract: reward.metadata.model = trajectory.metadata.model, also in
    the versions late feedback produces."""
    from agentrl.rewards.calculator import rescore_with_feedback

    doc = sample_trajectory(5)
    doc.setdefault("metadata", {})["model"] = "agentrl-policy@v7"
    (scored,), state = score_batch(
        [ScoringInput(TrajectoryEvent.model_validate(doc))], WindowState(), RewardConfig()
    )
    assert (scored.event.metadata.model_extra or {})["model"] == "agentrl-policy@v7"
    fb = C.FeedbackState()
    fb.apply("thumbs_up", None, "fb-1")
    v2 = rescore_with_feedback(scored.payload, fb, state, RewardConfig())
    assert (v2.event.metadata.model_extra or {})["model"] == "agentrl-policy@v7"
