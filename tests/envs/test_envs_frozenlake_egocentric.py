"""FrozenLake's egocentric observation: the same state is the same text in every episode."""

from __future__ import annotations

import pytest

from agentrl.envs import make_env
from agentrl.envs.frozenlake import FrozenLakeTextEnv


def test_egocentric_text_names_position_goal_and_neighbours() -> None:
    env = FrozenLakeTextEnv(size=2, desc=["SF", "HG"], obs_format="egocentric")
    text = env.reset(0)["text"]
    assert text.startswith("You are at row 0, column 0. The goal is at row 1, column 1.")
    assert "Up: wall. Down: hole. Left: wall. Right: frozen." in text
    assert env.valid_actions() == ["up", "down", "left", "right"]
    obs, _, done, info = env.step("right")
    assert not done and "Down: goal." in obs["text"] and info["position"] == (0, 1)
    _, _, done, info = env.step("down")
    assert done and info["success"] and env.valid_actions() == []


def test_same_state_same_prompt_across_episodes_and_steps() -> None:
    a = make_env("frozenlake-4x4", obs_format="egocentric", max_steps=12)
    b = make_env("frozenlake-4x4", obs_format="egocentric", max_steps=12)
    first = a.reset(5)["text"]
    b.reset(5)
    bumped, _, _, _ = b.step("up")  # into the wall: same state, later step
    assert bumped["text"] == first  # no step counter, no headline
    assert "Steps left" not in first


def test_unknown_format_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="obs_format"):
        FrozenLakeTextEnv(obs_format="ascii-art")
