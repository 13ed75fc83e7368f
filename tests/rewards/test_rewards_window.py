"""Normalisation windows: batch == one at a time, trailing size, persistence, None handling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.rewards import RewardConfig, ScoringInput, score_batch
from agentrl.rewards.calculator import TOTAL
from agentrl.rewards.window import TrailingWindow, WindowState


@settings(max_examples=60, deadline=None)
@given(
    old=st.lists(st.floats(0, 1), max_size=12),
    new=st.lists(st.floats(0, 1), min_size=1, max_size=12),
    size=st.integers(1, 8),
    include_self=st.booleans(),
)
def test_batch_stats_equal_one_at_a_time(
    old: list[float], new: list[float], size: int, include_self: bool
) -> None:
    w = TrailingWindow(size, np.array(old))
    count, mean, std = w.batch_stats(new, include_self=include_self)
    seq = w
    for i, x in enumerate(new):
        vals = np.concatenate([seq.values, [x]])[-size:] if include_self else seq.values
        assert count[i] == len(vals)
        if len(vals):
            assert mean[i] == pytest.approx(np.mean(vals), abs=1e-9)
            assert std[i] == pytest.approx(np.std(vals), abs=1e-6)
        seq = seq.extended([x])
    assert w.extended(new).values.tolist() == seq.values.tolist()


def test_window_keeps_only_the_trailing_values() -> None:
    w = TrailingWindow(3).extended([1, 2, 3, 4, 5])
    assert w.values.tolist() == [3, 4, 5]
    assert w.mean_std() == (pytest.approx(4.0), pytest.approx(np.std([3, 4, 5])))
    with pytest.raises(ValueError, match="window size"):
        TrailingWindow(0)


def test_state_round_trips_through_bytes_and_resizes() -> None:
    state = WindowState(5, 4).updated(
        {"a": [0.1, 0.2, 0.3], TOTAL: [1.0]}, {"coding": [3, 4, 5, 6, 7]}
    )
    back = WindowState.from_bytes(state.to_bytes())
    assert back.size == 5 and back.efficiency_size == 4
    assert back.components["a"].values.tolist() == [0.1, 0.2, 0.3]
    assert back.turns["coding"].values.tolist() == [4, 5, 6, 7]
    small = WindowState.from_bytes(state.to_bytes(), size=2)
    assert small.components["a"].values.tolist() == [0.2, 0.3]


def _items(n: int, offset: int = 0) -> list[ScoringInput]:
    return [
        ScoringInput(TrajectoryEvent.model_validate(sample_trajectory(offset + i)))
        for i in range(n)
    ]


def test_scoring_a_batch_equals_scoring_one_by_one() -> None:
    cfg = RewardConfig(window=20, efficiency_window=15, efficiency_min_history=3)
    items = _items(60)
    batch, s_batch = score_batch(items, WindowState(20, 15), cfg)
    state = WindowState(20, 15)
    for item, b in zip(items, batch, strict=True):
        (one,), state = score_batch([item], state, cfg)
        assert one.payload["normalization"]["normalized_total_reward"] == pytest.approx(
            b.payload["normalization"]["normalized_total_reward"], abs=1e-9
        )
        assert one.payload["normalization"]["raw_total_reward"] == pytest.approx(
            b.payload["normalization"]["raw_total_reward"], abs=1e-12
        )
        for name, comp in b.payload["reward_components"].items():
            assert one.payload["reward_components"][name]["score"] == pytest.approx(comp["score"])
    for name, w in s_batch.components.items():
        assert state.components[name].values == pytest.approx(w.values, abs=1e-12)
    for name, w in s_batch.turns.items():
        assert state.turns[name].values.tolist() == w.values.tolist()
    assert len(s_batch.components["task_completion"]) == 20


def test_normalised_scores_are_z_scores_over_the_trailing_window() -> None:
    cfg = RewardConfig(window=4)
    history = [0.0, 1.0, 1.0]
    state = WindowState(
        4, 1000, components={"task_completion": TrailingWindow(4, np.array(history))}
    )
    doc = sample_trajectory(3, status="completed_successfully")
    (r,), new = score_batch([ScoringInput(TrajectoryEvent.model_validate(doc))], state, cfg)
    vals = [*history, 1.0]
    comp = r.payload["reward_components"]["task_completion"]
    assert comp["window_mean"] == pytest.approx(np.mean(vals))
    assert comp["normalized_score"] == pytest.approx((1.0 - np.mean(vals)) / (np.std(vals) + 1e-8))
    assert new.components["task_completion"].values.tolist() == vals


def test_a_component_that_does_not_apply_contributes_zero_after_normalisation() -> None:
    cfg = RewardConfig()
    items = _items(30)  # no code in any: code_quality is None everywhere
    rewards, state = score_batch(items, WindowState(), cfg)
    assert "code_quality" not in state.components
    w = cfg.component_weights()
    for r in rewards:
        comps = r.payload["reward_components"]
        assert "code_quality" not in comps
        want = sum(w[n] * c["normalized_score"] for n, c in comps.items())
        assert r.payload["normalization"]["normalized_total_reward"] == pytest.approx(want)
