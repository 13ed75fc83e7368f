"""The BFS expert: its moves reach the goal in the real environment, and are shortest."""

from __future__ import annotations

from agentrl.envs.frozenlake import FrozenLakeTextEnv, shortest_path


def test_bfs_moves_reach_the_goal_on_random_maps() -> None:
    env = FrozenLakeTextEnv(size=4, obs_format="egocentric")
    for seed in range(40):
        env.reset(seed)
        moves = shortest_path(env.desc)
        assert moves is not None  # generate_random_map guarantees a path
        info: dict = {}
        for move in moves:
            _, _, done, info = env.step(move)
            assert not info.get("fell_in_hole")
        assert done and info["success"], (seed, moves)


def test_bfs_is_shortest_and_handles_edge_cases() -> None:
    desc = ["SFF", "HHF", "GFF"]  # the only way round is right, right, down, down, left, left
    assert shortest_path(desc) == ["right", "right", "down", "down", "left", "left"]
    assert shortest_path(["SF", "FG"]) in (["down", "right"], ["right", "down"])
    assert shortest_path(["SH", "HG"]) is None
    assert shortest_path(["SG"], start=(0, 1)) == []
