"""Text Sokoban: push every box onto a target in a small procedurally generated room.

Rooms are generated the way gym-sokoban does it, by playing backwards from the solved
state: the boxes start on their targets and the player *pulls* them away. Every pull is the
reverse of a legal push, so the resulting room is solvable by construction; a breadth-first
solver double-checks it and gives the optimal plan (tests and scripted experts use it).
Everything is drawn from `numpy.random.default_rng(seed)`, so a seed is a level.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.envs.actions import parse_direction
from agentrl.envs.base import Observation

WALL, FLOOR = 0, 1
MOVES: dict[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}
LEGEND = (
    "Legend: # wall, _ floor, O target, X box, * box on a target, P you, "
    "S you standing on a target."
)

OBS_FORMATS = ("grid", "egocentric", "relative", "outcomes")

Pos = tuple[int, int]


@dataclass(frozen=True)
class Level:
    """A room: walls/floor, targets, and the start positions of boxes and player."""

    floor: np.ndarray  # bool (dim, dim): True where one can stand
    targets: frozenset[Pos]
    boxes: frozenset[Pos]
    player: Pos


def render(floor: np.ndarray, targets: frozenset[Pos], boxes: frozenset[Pos], player: Pos) -> str:
    rows = []
    for r in range(floor.shape[0]):
        line = []
        for c in range(floor.shape[1]):
            p = (r, c)
            if not floor[r, c]:
                ch = "#"
            elif p == player:
                ch = "S" if p in targets else "P"
            elif p in boxes:
                ch = "*" if p in targets else "X"
            elif p in targets:
                ch = "O"
            else:
                ch = "_"
            line.append(ch)
        rows.append("".join(line))
    return "\n".join(rows)


def parse_level(text: str) -> Level:
    """A level from its rendering (the legend's symbols), e.g. for hand-made puzzles.

    Cells outside the drawn rows count as walls; the player and box counts are checked.
    """
    rows = [line.strip() for line in text.strip("\n").splitlines() if line.strip()]
    width = max(len(r) for r in rows)
    rows = [r.ljust(width, "#") for r in rows]
    edges = rows[0] + rows[-1] + "".join(r[0] + r[-1] for r in rows)
    if set(edges) != {"#"}:  # not enclosed: add the outer wall
        rows = ["#" * (width + 2)] + [f"#{r}#" for r in rows] + ["#" * (width + 2)]
    floor = np.zeros((len(rows), len(rows[0])), dtype=bool)
    targets: set[Pos] = set()
    boxes: set[Pos] = set()
    players: list[Pos] = []
    for r, line in enumerate(rows):
        for c, ch in enumerate(line):
            if ch in "#":
                continue
            if ch not in "_ OX*PS":
                raise ValueError(f"unknown Sokoban symbol {ch!r} at row {r - 1}; see LEGEND")
            floor[r, c] = True
            if ch in "O*S":
                targets.add((r, c))
            if ch in "X*":
                boxes.add((r, c))
            if ch in "PS":
                players.append((r, c))
    if len(players) != 1:
        raise ValueError(f"a level needs exactly one player (P or S), found {len(players)}")
    if not boxes or len(boxes) != len(targets):
        raise ValueError(
            f"a level needs as many targets as boxes (>0): {len(boxes)} boxes, {len(targets)} targets"
        )
    return Level(floor=floor, targets=frozenset(targets), boxes=frozenset(boxes), player=players[0])


def solve(level: Level, max_states: int = 200_000) -> list[str] | None:
    """Shortest move sequence that puts every box on a target (BFS), or None if none exists."""
    start = (level.player, level.boxes)
    if level.boxes <= level.targets:
        return []
    parent: dict[tuple[Pos, frozenset[Pos]], tuple[Any, str]] = {start: (None, "")}
    queue = deque([start])
    while queue and len(parent) < max_states:
        state = queue.popleft()
        player, boxes = state
        for name, (dr, dc) in MOVES.items():
            nxt = (player[0] + dr, player[1] + dc)
            if not level.floor[nxt]:
                continue
            new_boxes = boxes
            if nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if not level.floor[beyond] or beyond in boxes:
                    continue
                new_boxes = (boxes - {nxt}) | {beyond}
            new_state = (nxt, new_boxes)
            if new_state in parent:
                continue
            parent[new_state] = (state, name)
            if new_boxes <= level.targets:
                plan = []
                cur: Any = new_state
                while parent[cur][0] is not None:
                    prev, move = parent[cur]
                    plan.append(move)
                    cur = prev
                return plan[::-1]
            queue.append(new_state)
    return None


def generate_level(
    seed: int, dim: int = 6, num_boxes: int = 1, min_moves: int = 4, max_tries: int = 200
) -> Level:
    """A solvable room of `dim` x `dim` cells (walls included) with `num_boxes` boxes.

    Rooms whose optimal solution is shorter than `min_moves` are redrawn (a one-move
    puzzle teaches nothing); after `max_tries` any solvable room is accepted.
    """
    if dim < 5:
        raise ValueError(f"dim must be >= 5 (a 3x3 floor at least), got {dim}")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
    rng = np.random.default_rng(seed)
    fallback: Level | None = None
    for _ in range(max_tries):
        level = _try_level(rng, dim, num_boxes)
        if level is None:
            continue
        plan = solve(level)
        if plan is None:
            continue
        if len(plan) >= min_moves:
            return level
        fallback = fallback or level
    if fallback is not None:
        return fallback
    raise RuntimeError(f"could not generate a Sokoban room for seed {seed} in {max_tries} tries")


def _try_level(rng: np.random.Generator, dim: int, num_boxes: int) -> Level | None:
    floor = np.zeros((dim, dim), dtype=bool)
    floor[1:-1, 1:-1] = True
    # A few interior walls, kept only if the floor stays connected.
    interior = [(r, c) for r in range(1, dim - 1) for c in range(1, dim - 1)]
    for _ in range(int(rng.integers(0, max(1, (dim - 2) ** 2 // 6) + 1))):
        cell = interior[int(rng.integers(len(interior)))]
        floor[cell] = False
        if not _connected(floor):
            floor[cell] = True
    cells: list[Pos] = [(int(p[0]), int(p[1])) for p in np.argwhere(floor)]
    if len(cells) < num_boxes + 2:
        return None
    picks = rng.choice(len(cells), size=num_boxes + 1, replace=False)
    targets = frozenset(cells[int(i)] for i in picks[:num_boxes])
    player: Pos = cells[int(picks[-1])]
    boxes = set(targets)
    best: tuple[int, frozenset[Pos], Pos] | None = None
    moves = list(MOVES.values())
    pulls = 0
    for _ in range(int(rng.integers(20, 60))):
        dr, dc = moves[int(rng.integers(4))]
        nxt = (player[0] + dr, player[1] + dc)
        if not floor[nxt] or nxt in boxes:
            continue
        behind = (player[0] - dr, player[1] - dc)
        if behind in boxes and rng.random() < 0.8:  # pull the box along
            boxes.remove(behind)
            boxes.add(player)
            pulls += 1
        player = nxt
        off = [b for b in boxes if b not in targets]
        if off:
            # gym-sokoban's score: pulls made times how far the boxes are from targets.
            distance = sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in targets) for b in off)
            score = pulls * distance
            if best is None or score > best[0]:
                best = (score, frozenset(boxes), player)
    if best is None:
        return None
    return Level(floor=floor, targets=targets, boxes=best[1], player=best[2])


def cornered(floor: np.ndarray, box: Pos) -> bool:
    """A box with a wall on two perpendicular sides can never move again."""
    r, c = box
    vert = not floor[r - 1, c] or not floor[r + 1, c]
    horiz = not floor[r, c - 1] or not floor[r, c + 1]
    return bool(vert and horiz)


def nearest(p: Pos, cells: frozenset[Pos]) -> int:
    """Manhattan distance from `p` to the nearest of `cells`."""
    return min(abs(p[0] - c[0]) + abs(p[1] - c[1]) for c in cells)


def _push_distances(
    floor: np.ndarray, targets: frozenset[Pos], boxes: frozenset[Pos]
) -> dict[Pos, int]:
    """Walking distance (around boxes) from each reachable cell to the nearest useful push
    spot: a cell beside a box off target from which a push moves that box closer to a target
    without jamming it in a corner. Multi-source BFS from the spots outwards."""
    spots = []
    for b in boxes - targets:
        for dr, dc in MOVES.values():
            spot, beyond = (b[0] - dr, b[1] - dc), (b[0] + dr, b[1] + dc)
            if not floor[spot] or spot in boxes or not floor[beyond] or beyond in boxes:
                continue
            if nearest(beyond, targets) >= nearest(b, targets):
                continue
            if beyond not in targets and cornered(floor, beyond):
                continue
            spots.append(spot)
    dist = dict.fromkeys(spots, 0)
    queue = deque(spots)
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            n = (r + dr, c + dc)
            if floor[n] and n not in boxes and n not in dist:
                dist[n] = dist[(r, c)] + 1
                queue.append(n)
    return dist


def _connected(floor: np.ndarray) -> bool:
    cells = {(int(p[0]), int(p[1])) for p in np.argwhere(floor)}
    if not cells:
        return False
    start = next(iter(cells))
    seen = {start}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            n = (r + dr, c + dc)
            if n in cells and n not in seen:
                seen.add(n)
                queue.append(n)
    return len(seen) == len(cells)


class SokobanEnv:
    """Text Sokoban behind the `TextEnv` protocol.

    `obs_format` "grid" shows the room with a headline (and a step counter when `max_steps`
    is set); "egocentric" names the player's, boxes' and targets' rows/columns and what lies
    up/down/left/right (wall, floor, target, box, box on target), with no headline and no
    counter, so the same state is the same text in every episode; "relative" gives each box's
    offset from the player and its target's from the box instead of rows and columns;
    "outcomes" says what each move would achieve (a push toward a target, a walk nearer to a
    spot to push from, ...). `valid_actions()` lists the moves.

    Reward: `success_reward` when the last box lands on a target (the episode ends), plus
    `step_penalty` on every step (0 by default; e.g. -0.01 to prefer short solutions) and
    `invalid_action_penalty` on unparsable actions. `max_steps` (None = unlimited; the rollout
    worker usually enforces its own limit) ends the episode with `info["truncated"]`.
    """

    env_id = "sokoban"

    def __init__(
        self,
        dim: int = 6,
        num_boxes: int = 1,
        min_moves: int = 4,
        max_steps: int | None = None,
        step_penalty: float = 0.0,
        invalid_action_penalty: float = 0.0,
        success_reward: float = 1.0,
        layout: str | None = None,
        obs_format: str = "grid",
    ) -> None:
        if obs_format not in OBS_FORMATS:
            raise ValueError(f"obs_format must be one of {OBS_FORMATS}, got {obs_format!r}")
        self.obs_format = obs_format
        # egocentric/relative text names player, boxes, targets and surroundings: the whole
        # state, so a rollout worker shows only the latest observation
        self.observation_stands_alone = obs_format != "grid"
        self.layout = parse_level(layout) if layout is not None else None
        self.dim = dim
        self.num_boxes = num_boxes
        self.min_moves = min_moves
        self.max_steps = max_steps
        self.step_penalty = step_penalty
        self.invalid_action_penalty = invalid_action_penalty
        self.success_reward = success_reward
        self.ground_truth: Any = None
        self.level: Level | None = None
        self._boxes: frozenset[Pos] = frozenset()
        self._player: Pos = (0, 0)
        self._steps = 0
        self._done = False

    # ---- protocol ----------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Observation:
        self.level = self.layout or generate_level(
            0 if seed is None else int(seed), self.dim, self.num_boxes, self.min_moves
        )
        self._boxes = self.level.boxes
        self._player = self.level.player
        self._steps = 0
        self._done = False
        h, w = self.level.floor.shape
        return self._observation(f"Sokoban {h}x{w}: push every box (X) onto a target (O).")

    def step(self, action_text: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        if self.level is None or self._done:
            return self._after_end()
        direction, reason = parse_direction(action_text)
        if direction is None:
            self._steps += 1
            return self._invalid(
                f"Invalid action ({reason}). Answer with exactly one of up, down, left, right, "
                'or JSON {"tool_name": "move", "tool_args": {"direction": "up"}}.'
            )
        self._steps += 1
        dr, dc = MOVES[direction]
        player = self._player
        nxt = (player[0] + dr, player[1] + dc)
        pushed = False
        moved = False
        if self.level.floor[nxt]:
            if nxt in self._boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if self.level.floor[beyond] and beyond not in self._boxes:
                    self._boxes = (self._boxes - {nxt}) | {beyond}
                    self._player = nxt
                    moved = pushed = True
            else:
                self._player = nxt
                moved = True
        if pushed:
            what = f"You pushed a box {direction}."
        elif moved:
            what = f"You moved {direction}."
        else:
            what = f"You could not move {direction} (blocked); nothing changed."
        success = self._boxes <= self.level.targets
        reward = self.step_penalty + (self.success_reward if success else 0.0)
        truncated = not success and self.max_steps is not None and self._steps >= self.max_steps
        self._done = success or truncated
        if success:
            what += " Every box is on a target: solved!"
        info = {
            "success": success,
            "invalid_action": False,
            "action": direction,
            "moved": moved,
            "pushed": pushed,
            "boxes_on_target": len(self._boxes & self.level.targets),
            "truncated": truncated,
        }
        return self._observation(what), reward, self._done, info

    # ---- helpers -----------------------------------------------------------------------
    def optimal_plan(self) -> list[str] | None:
        """The shortest solution from the current state (BFS), for tests and experts."""
        if self.level is None:
            return None
        return solve(Level(self.level.floor, self.level.targets, self._boxes, self._player))

    def grid(self) -> str:
        assert self.level is not None
        return render(self.level.floor, self.level.targets, self._boxes, self._player)

    def valid_actions(self) -> list[str]:
        """The moves a policy may choose from (a valid-action policy scores exactly these)."""
        return list(MOVES) if self.level is not None and not self._done else []

    def _cell_word(self, p: Pos) -> str:
        assert self.level is not None
        h, w = self.level.floor.shape
        if not (0 <= p[0] < h and 0 <= p[1] < w) or not self.level.floor[p]:
            return "wall"
        if p in self._boxes:
            return "box on a target" if p in self.level.targets else "box"
        return "target" if p in self.level.targets else "floor"

    def egocentric(self) -> str:
        """Player, boxes, targets (row/column) and the four neighbours: repeats across
        episodes, since nothing in it depends on the step count."""
        assert self.level is not None
        r0, c0 = self._player

        def places(cells: frozenset[Pos]) -> str:
            return "; ".join(f"row {r}, column {c}" for r, c in sorted(cells))

        around = " ".join(
            f"{name.capitalize()}: {self._cell_word((r0 + dr, c0 + dc))}."
            for name, (dr, dc) in MOVES.items()
        )
        on = len(self._boxes & self.level.targets)
        return (
            f"You are at row {r0}, column {c0}. Boxes at {places(self._boxes)}. "
            f"Targets at {places(self.level.targets)}. Boxes on targets: "
            f"{on}/{len(self.level.targets)}. {around}"
        )

    def relative(self) -> str:
        """Where each box lies from the player and its nearest target from the box, in the
        moves' own words ("1 down and 2 right"), and the four neighbours. Absolute rows and
        columns make the model do the subtraction; offsets repeat across rooms."""
        assert self.level is not None
        r0, c0 = self._player

        def offset(dr: int, dc: int) -> str:
            parts = []
            if dr:
                parts.append(f"{abs(dr)} {'down' if dr > 0 else 'up'}")
            if dc:
                parts.append(f"{abs(dc)} {'right' if dc > 0 else 'left'}")
            return " and ".join(parts) or "0"

        lines = []
        for br, bc in sorted(self._boxes):
            if (br, bc) in self.level.targets:
                lines.append(f"A box on a target is {offset(br - r0, bc - c0)} of you.")
                continue
            tr, tc = min(self.level.targets, key=lambda t: abs(t[0] - br) + abs(t[1] - bc))
            lines.append(
                f"A box is {offset(br - r0, bc - c0)} of you; its target is "
                f"{offset(tr - br, tc - bc)} of the box."
            )
        around = " ".join(
            f"{name.capitalize()}: {self._cell_word((r0 + dr, c0 + dc))}."
            for name, (dr, dc) in MOVES.items()
        )
        return " ".join(lines) + " " + around

    def outcomes(self) -> str:
        """What each move would do, in words: a wall; a push that puts a box on its target,
        moves it toward or away from one, jams it in a corner or is blocked; a walk that
        brings the player nearer to (or farther from) a spot to push a box from. The
        egocentric idea one step further: FrozenLake's neighbours say what a move meets,
        these say what it achieves, so a policy can learn Sokoban as a choice among
        described consequences within a CPU budget (positions as numbers need arithmetic
        that a 135M model did not learn in 640 episodes: BENCHMARKS.md)."""
        assert self.level is not None
        floor, targets, boxes = self.level.floor, self.level.targets, self._boxes
        r0, c0 = self._player
        dist = _push_distances(floor, targets, boxes)
        here = dist.get(self._player)
        parts = []
        for name, (dr, dc) in MOVES.items():
            nxt = (r0 + dr, c0 + dc)
            if not floor[nxt]:
                what = "wall"
            elif nxt in boxes:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if not floor[beyond] or beyond in boxes:
                    what = "box, blocked: it cannot be pushed"
                elif beyond in targets:
                    what = "box, a push puts it on a target"
                elif nxt in targets:
                    what = "box on a target, a push moves it off"
                elif cornered(floor, beyond):
                    what = "box, a push jams it in a corner"
                elif nearest(beyond, targets) < nearest(nxt, targets):
                    what = "box, a push moves it toward a target"
                else:
                    what = "box, a push moves it away from the targets"
            else:
                there = dist.get(nxt)
                what = "target" if nxt in targets else "floor"
                if here is not None and there is not None and there != here:
                    side = "nearer to" if there < here else "farther from"
                    what += f", {side} a spot to push a box from"
            parts.append(f"{name.capitalize()}: {what}.")
        on = len(boxes & targets)
        return f"Boxes on targets: {on}/{len(targets)}. " + " ".join(parts)

    def _observation(self, headline: str) -> Observation:
        grid = self.grid()
        assert self.level is not None
        if self.obs_format != "grid":
            text = {
                "egocentric": self.egocentric,
                "relative": self.relative,
                "outcomes": self.outcomes,
            }[self.obs_format]()
            if self._done:
                text = f"{headline}\n{text}"
            else:
                text += " Your move: up, down, left or right?"
            return {"text": text, "anchor": grid}
        on = len(self._boxes & self.level.targets)
        lines = [headline, LEGEND, grid, f"Boxes on targets: {on}/{len(self.level.targets)}."]
        if self.max_steps is not None:
            lines.append(f"Steps left: {max(0, self.max_steps - self._steps)}.")
        if not self._done:
            lines.append("Your move: up, down, left or right?")
        return {"text": "\n".join(lines), "anchor": grid}

    def _after_end(self) -> tuple[Observation, float, bool, dict[str, Any]]:
        """A step outside an episode: flagged, not raised (the protocol never raises)."""
        if self.level is None:
            obs: Observation = {"text": "No episode: call reset(seed) first.", "anchor": ""}
        else:
            obs = self._observation("The episode is over; call reset(seed) for a new one.")
        return obs, 0.0, True, {"invalid_action": True, "success": False, "episode_over": True}

    def _invalid(self, message: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        truncated = not self._done and self.max_steps is not None and self._steps >= self.max_steps
        self._done = self._done or truncated
        obs = self._observation(message)
        reward = self.invalid_action_penalty + self.step_penalty
        info = {"invalid_action": True, "success": False, "truncated": truncated}
        return obs, reward, self._done, info
