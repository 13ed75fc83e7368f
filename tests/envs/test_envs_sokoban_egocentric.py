"""Sokoban's egocentric observation: positions and neighbours, repeating across episodes."""

from __future__ import annotations

import pytest

from agentrl.envs import make_env
from agentrl.envs.sokoban import MOVES, SokobanEnv

ROOM = "######\n#_PX_#\n#___O#\n######"


def test_egocentric_names_player_boxes_targets_and_neighbours() -> None:
    env = SokobanEnv(layout=ROOM, obs_format="egocentric")
    text = env.reset(0)["text"]
    assert text == (
        "You are at row 1, column 2. Boxes at row 1, column 3. Targets at row 2, column 4. "
        "Boxes on targets: 0/1. Up: wall. Down: floor. Left: floor. Right: box. "
        "Your move: up, down, left or right?"
    )
    assert env.valid_actions() == ["up", "down", "left", "right"]
    env.step("right")  # push the box to (1, 4); the player is at (1, 3)
    obs, _, done, _ = env.step("down")  # at (2, 3): the target is to the right
    assert "row 2, column 3" in obs["text"] and "Right: target." in obs["text"] and not done
    assert "Up: floor." in obs["text"]
    assert obs["anchor"] == env.grid()  # the room's grid stays the anchor


def test_egocentric_box_on_target_and_end_of_episode() -> None:
    env = SokobanEnv(layout="#####\n#PXO#\n#####", obs_format="egocentric")
    env.reset(0)
    obs, reward, done, info = env.step("right")
    assert done and info["success"] and reward == 1.0
    assert "Boxes on targets: 1/1." in obs["text"] and "Right: box on a target." in obs["text"]
    assert obs["text"].startswith("You pushed a box right.")
    assert env.valid_actions() == []


def test_egocentric_prompts_repeat_across_episodes_and_grid_stays_default() -> None:
    a = make_env("sokoban", obs_format="egocentric", max_steps=20)
    b = make_env("sokoban", obs_format="egocentric", max_steps=20)
    a.reset(3)
    first = b.reset(3)["text"]
    a.step("left")
    a.step("right")  # back where it started if nothing was pushed
    if a.grid() == b.grid():
        assert a.step("up")[0]["text"] == b.step("up")[0]["text"]
    assert "Steps left" not in first and "Legend" not in first
    assert "Legend" in make_env("sokoban").reset(3)["text"]
    with pytest.raises(ValueError, match="obs_format"):
        SokobanEnv(obs_format="pixels")


def test_relative_gives_offsets_in_the_moves_words() -> None:
    env = SokobanEnv(layout=ROOM, obs_format="relative")
    text = env.reset(0)["text"]
    assert text == (
        "A box is 1 right of you; its target is 1 down and 1 right of the box. "
        "Up: wall. Down: floor. Left: floor. Right: box. Your move: up, down, left or right?"
    )
    env.step("right")  # the box to (1, 4), the player to (1, 3)
    obs, _, done, _ = env.step("down")  # the player at (2, 3)
    assert obs["text"].startswith("A box is 1 up and 1 right of you; its target is 1 down of")
    assert not done and "Right: target." in obs["text"]
    # Two rooms with the same layout around the player read the same, wherever they sit.
    shifted = SokobanEnv(layout="#######\n" + "\n".join("#" + r for r in ROOM.splitlines()[1:]))
    shifted.obs_format = "relative"
    assert shifted.reset(0)["text"].split(" Up:")[0] == text.split(" Up:")[0]
    done_env = SokobanEnv(layout="#####\n#PXO#\n#####", obs_format="relative")
    done_env.reset(0)
    obs, _, done, _ = done_env.step("right")
    assert done and "A box on a target is 1 right of you." in obs["text"]


def test_outcomes_say_what_each_move_achieves() -> None:
    env = SokobanEnv(layout="######\n#P___#\n#_X__#\n#___O#\n######", obs_format="outcomes")
    text = env.reset(0)["text"]
    # The box (2, 2) closes on the target (3, 4) pushed right from (2, 1) or down from
    # (1, 2); the player at (1, 1) is one step from either.
    assert text == (
        "Boxes on targets: 0/1. Up: wall. Down: floor, nearer to a spot to push a box from. "
        "Left: wall. Right: floor, nearer to a spot to push a box from. "
        "Your move: up, down, left or right?"
    )
    obs, *_ = env.step("right")  # at (1, 2), on a spot
    assert "Down: box, a push moves it toward a target." in obs["text"]
    assert "Left: floor, farther from" in obs["text"] and "Right: floor, farther" in obs["text"]
    obs, *_ = env.step("down")  # the box to (3, 2); pushing right now needs (3, 1)
    assert "Down: box, blocked: it cannot be pushed." in obs["text"]
    assert "Left: floor, nearer to a spot" in obs["text"]
    env2 = SokobanEnv(layout="#####\n#PXO#\n#####", obs_format="outcomes")
    assert "Right: box, a push puts it on a target." in env2.reset(0)["text"]
    jam = SokobanEnv(layout="######\n#_PX_#\n#___O#\n######", obs_format="outcomes")
    assert "Right: box, a push jams it in a corner." in jam.reset(0)["text"]


def test_a_rule_reading_the_outcomes_solves_generated_rooms() -> None:
    """The words are right: always taking the best-described move solves the rooms (the
    learner has to discover this rule; the base model picks "up" almost always)."""

    def rule(text: str) -> str:
        said = {m: text.split(f"{m.capitalize()}:")[1].split(".")[0] for m in MOVES}
        for key in ("puts it on a target", "toward a target", "nearer to"):
            for move, words in said.items():
                if key in words:
                    return move
        return "up"

    solved = 0
    for seed in range(1_000_000, 1_000_060):
        env = SokobanEnv(dim=5, min_moves=3, obs_format="outcomes", max_steps=12)
        obs, done, info = env.reset(seed), False, {}
        while not done:
            obs, _, done, info = env.step(rule(obs["text"]))
        solved += bool(info["success"])
    assert solved == 60
