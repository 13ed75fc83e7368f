"""The loop's acting progress line (issue 55.8): trajectories played by two versions are
counted apart, never shown as a version called "unknown"."""

from __future__ import annotations

from agentrl.app.loop_agents import MIXED_MODEL
from agentrl.app.loop_decide import acting_line


def test_mixed_trajectories_are_counted_apart_not_as_a_version() -> None:
    by_model = {"agentrl-policy-base": 539, "agentrl-policy-v1": 176, MIXED_MODEL: 5}
    line = acting_line(720, 720, by_model, 5)
    assert MIXED_MODEL not in line
    assert "'agentrl-policy-base': 539" in line and "'agentrl-policy-v1': 176" in line
    assert line.endswith("5 played by two versions (credited to none)")


def test_no_mixed_note_when_every_trajectory_has_one_version() -> None:
    line = acting_line(3, 2, {"agentrl-policy-base": 3}, 0)
    assert line == "acting: 3 trajectories, 2 rewarded, by version {'agentrl-policy-base': 3}"
