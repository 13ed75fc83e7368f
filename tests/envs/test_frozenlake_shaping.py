"""FrozenLake's optional shaping (the learning configuration's, carried per turn by logged
trajectories): progress toward the goal per move, a penalty on the move into a hole, and
nothing changes when it is off."""

from __future__ import annotations

from agentrl.envs.frozenlake import FrozenLakeTextEnv

MAP = ["SFF", "FHF", "FFG"]


def test_progress_and_hole_penalty() -> None:
    env = FrozenLakeTextEnv(size=3, desc=MAP, progress_reward=0.3, hole_penalty=0.5)
    env.reset(0)
    _, r, done, _ = env.step("right")  # one cell closer to G at (2, 2)
    assert r == 0.3 and not done
    _, r, done, _ = env.step("left")  # one cell farther
    assert r == -0.3
    _, r, done, info = env.step("up")  # a wall: no move, no progress
    assert r == 0.0
    _, r, done, info = env.step("down")
    _, r, done, info = env.step("right")  # into the hole at (1, 1)
    assert info["fell_in_hole"] and done and r == -0.5


def test_goal_gets_success_plus_progress_and_default_is_unshaped() -> None:
    shaped = FrozenLakeTextEnv(size=3, desc=MAP, progress_reward=0.3)
    plain = FrozenLakeTextEnv(size=3, desc=MAP)
    totals = []
    for env in (shaped, plain):
        env.reset(0)
        rewards = [env.step(m)[1] for m in ("right", "right", "down", "down")]
        totals.append(rewards)
    assert totals[0] == [0.3, 0.3, 0.3, 1.3]
    assert totals[1] == [0.0, 0.0, 0.0, 1.0]
