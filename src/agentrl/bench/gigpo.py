"""Benchmark support for `agentrl bench gigpo`: a synthetic batch and a dictionary peer.

The batch looks like a gridworld training step: groups of 8 episodes from the same start,
each a random walk of 1-15 steps over (player, box) positions of a 6x6 room, so anchors recur
within a group. Anchors are fresh string objects (rendered grids), as real observations are.

`naive_gigpo` is the peer: the same semantics computed the way verl-agent's reference does
it, with dictionaries of ids and Python loops over rows (written linear-time here, so the
comparison is against a fair dictionary implementation, not against its O(n^2) returns pass).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.bench.options import GigpoBench, comma_list

EPISODES_PER_GROUP = 8
MAX_EPISODE_STEPS = 15
_INTERIOR = 4  # a 6x6 room has a 4x4 floor
_MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])


@dataclass
class SyntheticBatch:
    group_ids: np.ndarray
    episode_ids: np.ndarray
    anchors: list[str]
    step_rewards: np.ndarray
    episode_scores: np.ndarray

    def __len__(self) -> int:
        return len(self.step_rewards)


def _grid(player: int, box: int, target: int) -> str:
    rows = [["#"] * (_INTERIOR + 2)] + [["#"] + ["_"] * _INTERIOR + ["#"] for _ in range(_INTERIOR)]
    rows.append(["#"] * (_INTERIOR + 2))
    rows[target // _INTERIOR + 1][target % _INTERIOR + 1] = "."
    rows[box // _INTERIOR + 1][box % _INTERIOR + 1] = "$"
    rows[player // _INTERIOR + 1][player % _INTERIOR + 1] = "@"
    return "\n".join("".join(r) for r in rows)


def synthetic_batch(n_rows: int, seed: int = 0) -> SyntheticBatch:
    """About `n_rows` step rows (exactly n_rows after trimming the last episode)."""
    rng = np.random.default_rng(seed)
    cells = _INTERIOR * _INTERIOR
    n_ep = n_rows // ((1 + MAX_EPISODE_STEPS) // 2) + EPISODES_PER_GROUP
    n_ep += -n_ep % EPISODES_PER_GROUP
    lengths = rng.integers(1, MAX_EPISODE_STEPS + 1, n_ep)
    group_of_ep = np.arange(n_ep) // EPISODES_PER_GROUP
    n_groups = int(group_of_ep[-1]) + 1
    starts = rng.integers(0, cells, (n_groups, 2))
    box = starts[group_of_ep, 1]
    target = rng.integers(0, cells, n_groups)[group_of_ep]
    player = np.stack([starts[group_of_ep, 0] // _INTERIOR, starts[group_of_ep, 0] % _INTERIOR], 1)
    positions = np.empty((n_ep, MAX_EPISODE_STEPS), dtype=np.int64)
    for t in range(MAX_EPISODE_STEPS):  # vectorised over episodes
        positions[:, t] = player[:, 0] * _INTERIOR + player[:, 1]
        player = np.clip(player + _MOVES[rng.integers(0, 4, n_ep)], 0, _INTERIOR - 1)
    mask = np.arange(MAX_EPISODE_STEPS)[None, :] < lengths[:, None]
    ep_rows = np.repeat(np.arange(n_ep), lengths)
    pos_rows = positions[mask]
    pool: dict[tuple[int, int, int], str] = {}
    anchors: list[str] = []
    for e, p in zip(ep_rows.tolist(), pos_rows.tolist(), strict=True):
        key = (p, int(box[e]), int(target[e]))
        text = pool.get(key)
        if text is None:
            text = pool[key] = _grid(*key)
        anchors.append(text[:-1] + text[-1])  # a fresh object, like a new observation
    success = rng.random(n_ep) < 0.4
    scores = success.astype(np.float64)
    rewards = np.full(len(ep_rows), -0.01)
    last = np.cumsum(lengths) - 1
    rewards[last] += scores
    k = min(n_rows, len(ep_rows))
    return SyntheticBatch(
        group_ids=group_of_ep[ep_rows][:k],
        episode_ids=ep_rows[:k],
        anchors=anchors[:k],
        step_rewards=rewards[:k],
        episode_scores=scores[ep_rows][:k],
    )


def naive_gigpo(
    group_ids: Any,
    episode_ids: Any,
    anchors: Any,
    step_rewards: Any,
    episode_scores: Any,
    *,
    gamma: float = 0.95,
    omega: float = 0.5,
    combine: str = "convex",
    mode: str = "mean_std_norm",
    epsilon: float = 1e-6,
    episode_baseline: str = "trajectories",
) -> np.ndarray:
    """GiGPO with dictionaries and per-row loops (the verl-agent approach); the peer."""
    n = len(step_rewards)
    rewards = [float(x) for x in step_rewards]
    scores = [float(x) for x in episode_scores]
    groups = list(group_ids)
    episodes = list(episode_ids)

    rows_of_ep: dict[Any, list[int]] = defaultdict(list)
    for i, e in enumerate(episodes):
        rows_of_ep[e].append(i)
    returns = [0.0] * n
    for rows in rows_of_ep.values():
        running = 0.0
        for i in reversed(rows):
            running = rewards[i] + gamma * running
            returns[i] = running

    def stats(values: list[float], singleton_identity: bool) -> tuple[float, float]:
        if len(values) == 1:
            return (0.0, 1.0) if singleton_identity else (values[0], 1.0)
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        return mean, var**0.5

    def norm(x: float, mean: float, std: float) -> float:
        return x - mean if mode == "mean_norm" else (x - mean) / (std + epsilon)

    ep_members: dict[Any, list[float]] = defaultdict(list)
    if episode_baseline == "trajectories":
        for rows in rows_of_ep.values():
            ep_members[groups[rows[0]]].append(scores[rows[0]])
    else:
        for i in range(n):
            ep_members[groups[i]].append(scores[i])
    ep_stats = {g: stats(v, True) for g, v in ep_members.items()}

    step_members: dict[Any, list[float]] = defaultdict(list)
    for i in range(n):
        step_members[(groups[i], anchors[i])].append(returns[i])
    step_stats = {k: stats(v, False) for k, v in step_members.items()}

    out = np.empty(n)
    for i in range(n):
        a_e = norm(scores[i], *ep_stats[groups[i]])
        a_s = norm(returns[i], *step_stats[(groups[i], anchors[i])])
        out[i] = omega * a_e + (1 - omega) * a_s if combine == "convex" else a_e + omega * a_s
    return out


def _best_ms(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def run_gigpo_benchmark(
    sizes: list[int], *, repeats: int = 5, peer_max_rows: int = 100_000, seed: int = 0
) -> dict[str, Any]:
    """Time both implementations per size, print the table and the JSON line."""
    from rich.progress import Progress

    from agentrl.advantages.gigpo import gigpo_advantages
    from agentrl.bench.report import report

    options: dict[str, Any] = {"gamma": 0.95, "omega": 0.5, "combine": "convex"}
    rows: list[dict[str, Any]] = []
    figures: dict[str, Any] = {}
    with Progress(transient=True) as progress:
        task = progress.add_task("gigpo", total=len(sizes))
        for n in sizes:
            batch = synthetic_batch(n, seed=seed)

            def fast(batch: SyntheticBatch = batch) -> Any:
                return gigpo_advantages(
                    batch.group_ids,
                    batch.episode_ids,
                    batch.anchors,
                    batch.step_rewards,
                    batch.episode_scores,
                    **options,
                )

            result = fast()
            # Every timed run gets fresh anchor strings, so no run profits from hashes
            # cached by the previous one.
            copies = [[a[:-1] + a[-1] for a in batch.anchors] for _ in range(repeats)]
            it = iter(copies)

            def fast_fresh(batch: SyntheticBatch = batch, it: Any = it) -> Any:
                batch.anchors = next(it)
                return fast(batch)

            ms = _best_ms(fast_fresh, repeats)
            row: dict[str, Any] = {
                "rows": n,
                "ms": ms,
                "rows/s": n / (ms / 1e3),
                "anchor groups": result.n_step_groups,
                "rows/group": float(result.step_group_sizes.mean()),
            }
            if n <= peer_max_rows:
                peer_out = naive_gigpo(
                    batch.group_ids,
                    batch.episode_ids,
                    batch.anchors,
                    batch.step_rewards,
                    batch.episode_scores,
                    **options,
                )
                peer_ms = _best_ms(
                    lambda b=batch: naive_gigpo(
                        b.group_ids,
                        b.episode_ids,
                        b.anchors,
                        b.step_rewards,
                        b.episode_scores,
                        **options,
                    ),
                    max(1, min(repeats, 2)),
                )
                row["dict peer ms"] = peer_ms
                row["speedup"] = peer_ms / ms
                row["max |diff|"] = float(np.max(np.abs(peer_out - result.advantages)))
            rows.append(row)
            progress.advance(task)
    by_size = {r["rows"]: r for r in rows}
    ref = by_size.get(100_000, rows[-1])
    figures["rows_per_s"] = ref["rows/s"]
    figures["ms_100k"] = by_size[100_000]["ms"] if 100_000 in by_size else None
    for r in rows:
        figures[f"ms_{_label(r['rows'])}"] = r["ms"]
        if "speedup" in r:
            figures[f"speedup_{_label(r['rows'])}"] = r["speedup"]
            figures[f"peer_ms_{_label(r['rows'])}"] = r["dict peer ms"]
            figures[f"max_abs_diff_{_label(r['rows'])}"] = r["max |diff|"]
    figures["goal_ms_100k"] = 50.0
    return report("gigpo advantages (vectorised numpy vs dict peer)", rows, figures)


def _label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def command(cfg: GigpoBench) -> None:
    """`agentrl bench gigpo` (one BLAS thread: its table entry sets that before numpy loads)."""
    sizes = [int(s) for s in comma_list(cfg.sizes)]
    run_gigpo_benchmark(sizes, repeats=cfg.repeats, peer_max_rows=cfg.peer_max_rows, seed=cfg.seed)
