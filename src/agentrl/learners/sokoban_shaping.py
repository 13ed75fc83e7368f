"""Shaped per-step reward for Sokoban under the valid-action learner.

The FrozenLake terms carried over to boxes: `success_reward` when the last box lands on a
target, + `progress_reward` x the cells the boxes closed toward their nearest targets
(negative when pushed away), and - `hole_penalty` for the push that leaves a box in a
corner off target (a dead end: the level can no longer be solved); `approach_reward` (0 by
default) x the cells a walk closes toward the nearest box off target: without it nearly
every step of an unsolved room earns 0. Per-step credit puts
that penalty on the fatal push, which is where GiGPO's step-level groups can help.
"""

from __future__ import annotations

from typing import Any

from agentrl.envs.sokoban import cornered, nearest

Pos = tuple[int, int]


def box_distance(boxes: frozenset[Pos], targets: frozenset[Pos]) -> int:
    """Sum over boxes of the Manhattan distance to the nearest target."""
    return sum(nearest(b, targets) for b in boxes)


def sokoban_reward(config: Any, env: Any, before: Any, info: dict[str, Any]) -> float:
    """`before` is (player, boxes) ahead of the move; `env` holds the state after it."""
    level = env.level
    _, boxes_before = before
    boxes_after: frozenset[Pos] = env._boxes
    closed = box_distance(boxes_before, level.targets) - box_distance(boxes_after, level.targets)
    reward = config.progress_reward * closed
    approach = config.approach_reward
    if approach and boxes_after == boxes_before:  # a walk, not a push: toward a loose box?
        loose = boxes_before - level.targets
        if loose:
            player_before, _ = before
            reward += approach * (nearest(player_before, loose) - nearest(env._player, loose))
    if info.get("success"):
        return config.success_reward + reward
    moved = boxes_after - boxes_before
    if any(b not in level.targets and cornered(level.floor, b) for b in moved):
        reward -= config.hole_penalty
    return float(reward)
