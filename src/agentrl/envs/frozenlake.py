"""Text FrozenLake: walk from S to G over frozen tiles without falling into a hole.

Maps come from gymnasium's `generate_random_map(size, p, seed)` (which guarantees a path),
and the dynamics are gymnasium's own `FrozenLakeEnv` driven underneath, including its
slippery mode (the intended move succeeds with `success_rate`, otherwise the agent slides
to one of the perpendicular directions). `reset(seed)` seeds both the map and the slip
noise, so an episode is a deterministic function of the seed and the actions.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from agentrl.envs.actions import DIRECTIONS, parse_direction
from agentrl.envs.base import Observation

ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}  # gymnasium's action numbering
LEGEND = "Legend: S start, F frozen (safe), H hole, G goal, P you."
OBS_FORMATS = ("grid", "egocentric")
_TILE_WORDS = {"S": "frozen", "F": "frozen", "H": "hole", "G": "goal"}
_DELTAS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


class FrozenLakeTextEnv:
    """FrozenLake behind the `TextEnv` protocol.

    `size` 4 or 8 (any >= 2 works), `frozen_prob` the chance a generated tile is frozen,
    `is_slippery` gymnasium's slip dynamics. `obs_format` "grid" shows the whole board with
    a headline and a step counter; "egocentric" shows only the agent's and the goal's
    row/column and what lies up/down/left/right (frozen, hole, goal, wall): no headline,
    no counter, so the same state gives the same text in every episode (prompts repeat,
    and a policy can cache them). `valid_actions()` lists the moves. Reward: `success_reward` on reaching G, 0 on
    falling into a hole (the episode ends either way), `step_penalty` per step. Optional
    shaping (the learning configuration's, so logged trajectories carry it per turn):
    `progress_reward` per grid cell closed toward the goal on every move, and
    `-hole_penalty` instead of anything else on the move into a hole.
    """

    def __init__(
        self,
        size: int = 4,
        is_slippery: bool = False,
        frozen_prob: float = 0.8,
        success_rate: float = 1.0 / 3.0,
        max_steps: int | None = None,
        step_penalty: float = 0.0,
        invalid_action_penalty: float = 0.0,
        success_reward: float = 1.0,
        desc: list[str] | None = None,
        obs_format: str = "grid",
        progress_reward: float = 0.0,
        hole_penalty: float = 0.0,
    ) -> None:
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if obs_format not in OBS_FORMATS:
            raise ValueError(f"obs_format must be one of {OBS_FORMATS}, got {obs_format!r}")
        self.obs_format = obs_format
        # egocentric/relative text holds the whole state the policy needs (position, goal,
        # surroundings): a rollout worker then shows only the latest observation
        self.observation_stands_alone = obs_format != "grid"
        self.size = size
        self.is_slippery = is_slippery
        self.frozen_prob = frozen_prob
        self.success_rate = success_rate
        self.max_steps = max_steps
        self.step_penalty = step_penalty
        self.invalid_action_penalty = invalid_action_penalty
        self.success_reward = success_reward
        self.progress_reward = progress_reward
        self.hole_penalty = hole_penalty
        self.fixed_desc = desc
        self.env_id = f"frozenlake-{size}x{size}" + ("-slippery" if is_slippery else "")
        self.ground_truth: Any = None
        self.desc: list[str] = []
        self._env: FrozenLakeEnv | None = None
        self._state = 0
        self._steps = 0
        self._done = False

    def reset(self, seed: int | None = None) -> Observation:
        seed = 0 if seed is None else int(seed)
        self.desc = list(self.fixed_desc or generate_random_map(self.size, self.frozen_prob, seed))
        self._env = FrozenLakeEnv(
            desc=self.desc, is_slippery=self.is_slippery, success_rate=self.success_rate
        )
        state, _ = self._env.reset(seed=seed)
        self._state = int(state)
        self._steps = 0
        self._done = False
        n = len(self.desc)
        return self._observation(f"FrozenLake {n}x{n}: walk from S to the goal G; avoid holes H.")

    def step(self, action_text: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self._env is None or self._done:
            obs: Observation = (
                {"text": "No episode: call reset(seed) first.", "anchor": ""}
                if self._env is None
                else self._observation("The episode is over; call reset(seed) for a new one.")
            )
            return obs, 0.0, True, {"invalid_action": True, "success": False, "episode_over": True}
        self._steps += 1
        direction, reason = parse_direction(action_text)
        if direction is None:
            truncated = self.max_steps is not None and self._steps >= self.max_steps
            self._done = truncated
            text = (
                f"Invalid action ({reason}). Answer with exactly one of up, down, left, right, "
                'or JSON {"tool_name": "move", "tool_args": {"direction": "up"}}.'
            )
            bad: dict[str, Any] = {"invalid_action": True, "success": False, "truncated": truncated}
            reward = self.invalid_action_penalty + self.step_penalty
            return self._observation(text), reward, self._done, bad
        before = self._state
        state, _, terminated, _, _ = self._env.step(ACTIONS[direction])
        self._state = int(state)
        tile = self._tile(self._state)
        success = tile == "G"
        fell = tile == "H"
        truncated = not terminated and self.max_steps is not None and self._steps >= self.max_steps
        self._done = bool(terminated) or truncated
        if success:
            what = f"You moved {direction} and reached the goal!"
        elif fell:
            what = f"You moved {direction} and fell into a hole. Game over."
        elif self._state == before:
            what = f"You tried to move {direction} but stayed in place (edge of the lake)."
        else:
            what = f"You moved {direction}."
        if self.is_slippery and not success and not fell:
            what += " (The ice is slippery: you may slide sideways.)"
        reward = self.step_penalty + (self.success_reward if success else 0.0)
        if fell and self.hole_penalty:
            reward = -self.hole_penalty
        elif self.progress_reward:
            reward += self.progress_reward * self._closed(before, self._state)
        info: dict[str, Any] = {
            "success": success,
            "fell_in_hole": fell,
            "invalid_action": False,
            "action": direction,
            "position": self._pos(self._state),
            "truncated": truncated,
        }
        return self._observation(what), reward, self._done, info

    # ---- helpers -----------------------------------------------------------------------
    def _closed(self, before: int, after: int) -> int:
        """Grid cells closed toward the goal (Manhattan distance before minus after)."""
        gr, gc = self.goal()
        (br, bc), (ar, ac) = self._pos(before), self._pos(after)
        return (abs(gr - br) + abs(gc - bc)) - (abs(gr - ar) + abs(gc - ac))

    def _pos(self, state: int) -> tuple[int, int]:
        n = len(self.desc[0])
        return state // n, state % n

    def _tile(self, state: int) -> str:
        r, c = self._pos(state)
        return self.desc[r][c]

    def grid(self) -> str:
        r0, c0 = self._pos(self._state)
        rows = []
        for r, row in enumerate(self.desc):
            rows.append("".join("P" if (r, c) == (r0, c0) else ch for c, ch in enumerate(row)))
        return "\n".join(rows)

    def valid_actions(self) -> list[str]:
        """The moves a policy may choose from (a valid-action policy scores exactly these)."""
        return list(DIRECTIONS) if not self._done else []

    def goal(self) -> tuple[int, int]:
        for r, row in enumerate(self.desc):
            c = row.find("G")
            if c >= 0:
                return r, c
        raise ValueError("the map has no goal")

    def egocentric(self) -> str:
        """Agent and goal row/column plus the four neighbours: repeats across episodes."""
        r0, c0 = self._pos(self._state)
        gr, gc = self.goal()
        n = len(self.desc)
        around = []
        for name, (dr, dc) in _DELTAS.items():
            r, c = r0 + dr, c0 + dc
            what = "wall" if not (0 <= r < n and 0 <= c < n) else _TILE_WORDS[self.desc[r][c]]
            around.append(f"{name.capitalize()}: {what}.")
        return (
            f"You are at row {r0}, column {c0}. The goal is at row {gr}, column {gc}. "
            + " ".join(around)
        )

    def _observation(self, headline: str) -> Observation:
        if self.obs_format == "egocentric":
            grid = self.grid()
            text = self.egocentric()
            if self._done:
                text = f"{headline}\n{text}"
            else:
                text += " Your move: up, down, left or right?"
            return {"text": text, "anchor": grid}
        grid = self.grid()
        lines = [headline, LEGEND, grid]
        if self.max_steps is not None:
            lines.append(f"Steps left: {max(0, self.max_steps - self._steps)}.")
        if not self._done:
            lines.append("Your move: up, down, left or right?")
        return {"text": "\n".join(lines), "anchor": grid}


def shortest_path(desc: list[str], start: tuple[int, int] | None = None) -> list[str] | None:
    """The moves of a shortest walk from `start` (default: S) to G over non-hole tiles (BFS).

    Pure: the expert of supervised warm starts. Neighbours are tried in the order up, down,
    left, right, so the answer is deterministic; `[]` at the goal, None if G is unreachable.
    Valid for the non-slippery dynamics only (a slippery move may not land where intended).
    """
    n_rows, n_cols = len(desc), len(desc[0])
    if start is None:
        start = next((r, row.find("S")) for r, row in enumerate(desc) if "S" in row)
    parent: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == "G":
            moves: list[str] = []
            link = parent[cell]
            while link is not None:
                cell, move = link
                moves.append(move)
                link = parent[cell]
            return moves[::-1]
        for move, (dr, dc) in _DELTAS.items():
            r, c = cell[0] + dr, cell[1] + dc
            inside = 0 <= r < n_rows and 0 <= c < n_cols
            if inside and (r, c) not in parent and desc[r][c] != "H":
                parent[(r, c)] = (cell, move)
                queue.append((r, c))
    return None
