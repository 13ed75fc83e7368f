"""Seed correction: efficiency counts only in proportion to completion.

The seed's efficiency component rewards short episodes even when they fail; with the
correction a failed short episode never outscores a successful long one on total reward.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.trajectory import Outcome, TrajectoryEvent
from agentrl.rewards import RewardConfig, score_trajectory
from agentrl.rewards import components as C
from agentrl.rewards.window import TrailingWindow, WindowState


def traj(**kw: Any) -> TrajectoryEvent:
    return TrajectoryEvent.model_validate(sample_trajectory(7, **kw))


@pytest.mark.parametrize(
    ("status", "pct", "want"),
    [
        ("completed_successfully", 0.0, 1.0),
        ("partial_completion", 0.4, 0.4),
        ("failed", 0.9, 0.0),
    ],
)
def test_completion_fraction(status: str, pct: float, want: float) -> None:
    outcome = Outcome(task_status=status, completion_percentage=pct)  # type: ignore[arg-type]
    assert C.completion_fraction(outcome) == pytest.approx(want)
    assert C.completion_fraction(None) == 1.0


@pytest.mark.parametrize("short", [1, 2, 3])
@pytest.mark.parametrize("long", [8, 12, 30])
def test_failed_short_never_outscores_successful_long(short: int, long: int) -> None:
    cfg = RewardConfig(efficiency_min_history=2)
    history = np.array([4.0, 6.0, 8.0, 10.0, 6.0, 7.0])
    state = WindowState(turns={"research": TrailingWindow(1000, history)})
    failed, _ = score_trajectory(traj(domain="research", turns=short, status="failed"), state, cfg)
    won, _ = score_trajectory(
        traj(domain="research", turns=long, status="completed_successfully"), state, cfg
    )
    assert failed.reward_components["efficiency"].score == 0.0
    assert failed.total_reward < won.total_reward


def test_partial_completion_scales_efficiency() -> None:
    cfg = RewardConfig(efficiency_min_history=2)
    state = WindowState(turns={"research": TrailingWindow(1000, np.array([4.0, 6.0, 8.0, 10.0]))})
    t = traj(domain="research", turns=5, status="partial_completion")
    assert t.outcome is not None
    reward, _ = score_trajectory(t, state, cfg)
    raw = C.efficiency_score(5, 7.0, float(np.std([4.0, 6.0, 8.0, 10.0])))
    got = reward.reward_components["efficiency"].score
    assert got == pytest.approx(raw * t.outcome.completion_percentage, abs=0.02)
