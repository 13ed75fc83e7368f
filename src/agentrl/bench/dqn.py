"""Benchmarks of the off-policy trainer (run by `agentrl bench dqn` and `agentrl bench per`).

`bench dqn` runs, per seed and side by side in one process, (a) this project's Double DQN
+ PER, (b) the same with kernel smoothing and early stopping, and (c) stable-baselines3
DQN with the rl-baselines3-zoo CartPole-v1 hyperparameters. The full mode runs every
agent for its whole budget (ours: `total_steps`, sb3: the zoo's 50,000 steps), so the
area under the learning curve, the TD-error variance and the early-stopping savings are
comparable; `--quick` stops each agent at its first greedy mean >= 475 (time to solve
only; early stopping is reported only if it fired before that). All three are evaluated by
the same greedy evaluator (10 episodes, fresh seeds each time) at the same cadence in
env steps, and the evaluation time is part of every wall clock. torch runs one thread
for all three (fastest for these small networks on CPU, and the same for everyone).

`bench per` times one sample + priority update of a 256 batch from a 1,000,000-transition
prioritized memory, beside a uniform sample and the classic per-sample Python sum tree.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.offpolicy.config import AGMConfigEntity, load_config
from agentrl.offpolicy.options import DqnBench, PerBench

# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 ("Almost Tuned").
SB3_ZOO_CARTPOLE: dict[str, Any] = {
    "n_timesteps": 50_000,
    "policy": "MlpPolicy",
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}


@dataclass
class RunFigures:
    """What one agent did on one seed."""

    agent: str
    seed: int
    solved_step: int | None
    solved_wall_s: float | None
    env_steps: int
    wall_s: float
    curve: list[tuple[int, float]] = field(default_factory=list)
    td_var: float = float("nan")
    stop_step: int | None = None
    stop_reason: str | None = None
    budget: int = 0
    best_eval: float = float("nan")

    @property
    def sps(self) -> float:
        return self.env_steps / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def auc(self) -> float:
        """Mean greedy return over the run (trapezoid over env steps, from 0 at step 0)."""
        if not self.curve:
            return float("nan")
        xs = np.array([0.0] + [c[0] for c in self.curve])
        ys = np.array([self.curve[0][1]] + [c[1] for c in self.curve])
        span = xs[-1] - xs[0]
        return float(np.trapezoid(ys, xs) / span) if span > 0 else float(ys[-1])


def _ours(cfg: AGMConfigEntity, agent: str) -> RunFigures:
    from agentrl.offpolicy.trainer import train

    result = train(cfg)
    evals = result.eval_rows
    td = [r["td_var_probe"] for r in evals if not math.isnan(r.get("td_var_probe", math.nan))]
    return RunFigures(
        agent=agent,
        seed=cfg.seed,
        solved_step=result.solved_step,
        solved_wall_s=result.solved_wall_s,
        env_steps=result.env_steps,
        wall_s=result.wall_s,
        curve=[(r["env_steps"], r["eval_return"]) for r in evals],
        td_var=float(np.mean(td)) if td else float("nan"),
        stop_step=result.stop_step,
        stop_reason=result.stop_reason,
        budget=cfg.total_steps,
        best_eval=result.best_eval,
    )


def _sb3(
    seed: int,
    eval_every: int,
    episodes: int,
    target: float,
    stop_at_target: bool,
    budget: int | None = None,
) -> RunFigures:
    """stable-baselines3 DQN with the zoo hyperparameters, probed like ours."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    from agentrl.offpolicy.collect import Evaluator

    hp = dict(SB3_ZOO_CARTPOLE)
    zoo_budget = int(hp.pop("n_timesteps"))
    budget = budget or zoo_budget
    evaluator = Evaluator("CartPole-v1", episodes, seed + 1_000_003)

    class Probe(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.t0 = 0.0
            self.curve: list[tuple[int, float]] = []
            self.td: list[float] = []
            self.solved: tuple[int, float] | None = None

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps % eval_every:
                return True
            model: Any = self.model
            with torch.no_grad():
                mean = float(
                    evaluator(lambda o: model.q_net(torch.as_tensor(o)).argmax(1).numpy()).mean()
                )
                self.curve.append((self.num_timesteps, mean))
                buf = model.replay_buffer
                if buf.size() >= 1024:
                    s = buf.sample(1024)
                    y = (
                        s.rewards.flatten()
                        + model.gamma
                        * (1 - s.dones.flatten())
                        * model.q_net_target(s.next_observations).max(1).values
                    )
                    q = model.q_net(s.observations).gather(1, s.actions.long()).flatten()
                    self.td.append(float((y - q).var(unbiased=False)))
            if self.solved is None and mean >= target:
                self.solved = (self.num_timesteps, time.perf_counter() - self.t0)
                return not stop_at_target
            return True

    env = gym.make("CartPole-v1")
    model = DQN(env=env, seed=seed, verbose=0, **hp)
    # its default logger makes an empty /tmp/SB3-<date> folder on every run: log nowhere
    model.set_logger(Logger(folder=None, output_formats=[]))
    probe = Probe()
    t0 = time.perf_counter()
    model.learn(budget, callback=probe)
    wall = time.perf_counter() - t0
    evaluator.close()
    env.close()
    return RunFigures(
        agent="sb3-dqn (zoo)",
        seed=seed,
        solved_step=probe.solved[0] if probe.solved else None,
        solved_wall_s=probe.solved[1] if probe.solved else None,
        env_steps=int(model.num_timesteps),
        wall_s=wall,
        curve=probe.curve,
        td_var=float(np.mean(probe.td)) if probe.td else float("nan"),
        budget=budget,
        best_eval=max((c[1] for c in probe.curve), default=float("nan")),
    )


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _agg(runs: list[RunFigures]) -> dict[str, Any]:
    """Mean figures over seeds; an unsolved seed counts with its whole run (a lower bound)."""
    solved = [r for r in runs if r.solved_step is not None]
    walls = [r.solved_wall_s if r.solved_wall_s is not None else r.wall_s for r in runs]
    steps = [r.solved_step if r.solved_step is not None else r.env_steps for r in runs]
    return {
        "solved": len(solved),
        "wall_s_to_475": _mean([float(w) for w in walls]),
        "steps_to_475": _mean([float(s) for s in steps]),
        "censored": len(solved) < len(runs),
        "sps": _mean([r.sps for r in runs]),
        "auc": _mean([r.auc for r in runs]),
        "td_var": _mean([r.td_var for r in runs if not math.isnan(r.td_var)]),
    }


def bench_dqn(
    config: str | Path,
    seeds: int = 3,
    quick: bool = False,
    with_sb3: bool = True,
    on_run: Callable[[RunFigures], None] | None = None,
    sb3_budget: int | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the three agents on `seeds` seeds; returns (table rows, JSON figures).

    `sb3_budget` replaces the zoo's 50,000 steps (only for smoke tests)."""
    import torch

    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same for all three (our configs ask for 1 thread too)
    try:
        return _bench_dqn(config, seeds, quick, with_sb3, on_run, sb3_budget)
    finally:
        torch.set_num_threads(old_threads)


def _bench_dqn(
    config: str | Path,
    seeds: int,
    quick: bool,
    with_sb3: bool,
    on_run: Callable[[RunFigures], None] | None,
    sb3_budget: int | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    base = load_config(config)
    target = base.evaluation.target_return or 475.0
    base = base.with_overrides(**{"evaluation.target_return": target})
    plain = base.with_overrides(
        **{
            "kernel_smoothing.enabled": False,
            "early_stopping.enabled": False,
            "evaluation.stop_at_target": quick,
        }
    )
    smooth = base.with_overrides(
        **{
            "kernel_smoothing.enabled": True,
            "early_stopping.enabled": True,
            "evaluation.stop_at_target": quick,
        }
    )
    runs: dict[str, list[RunFigures]] = {"a": [], "b": [], "c": []}
    for seed in range(seeds):
        for key, cfg, name in (
            ("a", plain, "ours: DDQN+PER"),
            ("b", smooth, "ours: +smoothing+early stop"),
        ):
            fig = _ours(cfg.with_overrides(seed=seed), name)
            runs[key].append(fig)
            if on_run:
                on_run(fig)
        if with_sb3:
            fig = _sb3(
                seed,
                base.evaluation.every_env_steps,
                base.evaluation.episodes,
                target,
                quick,
                sb3_budget,
            )
            runs["c"].append(fig)
            if on_run:
                on_run(fig)

    rows: list[dict[str, Any]] = []
    for key in ("a", "b", "c"):
        for r in runs[key]:
            rows.append(
                {
                    "agent": r.agent,
                    "seed": r.seed,
                    "steps to 475": r.solved_step
                    if r.solved_step is not None
                    else f">{r.env_steps}",
                    "wall s to 475": round(r.solved_wall_s, 2)
                    if r.solved_wall_s is not None
                    else f">{r.wall_s:.1f}",
                    "env steps run": r.env_steps,
                    "wall s run": round(r.wall_s, 2),
                    "SPS": round(r.sps),
                    "AUC (mean return)": round(r.auc, 1),
                    "TD var": round(r.td_var, 3),
                    "best return": round(r.best_eval, 1),
                    "early stop at": r.stop_step if r.stop_step is not None else "",
                    "steps saved": (r.budget - r.stop_step) if r.stop_step is not None else "",
                }
            )
    a, b = _agg(runs["a"]), _agg(runs["b"])
    figures: dict[str, Any] = {
        "seeds": seeds,
        "quick": quick,
        "target_return": target,
        "ours_wall_s_to_475": round(a["wall_s_to_475"], 3),
        "ours_steps_to_475": round(a["steps_to_475"], 1),
        "solved_seeds": a["solved"],
        "ours_censored": a["censored"],
        "ours_sps": round(a["sps"], 1),
        "ours_auc": round(a["auc"], 2),
        "ours_td_var": round(a["td_var"], 4),
        "smooth_wall_s_to_475": round(b["wall_s_to_475"], 3),
        "smooth_steps_to_475": round(b["steps_to_475"], 1),
        "smooth_solved_seeds": b["solved"],
        "smooth_auc": round(b["auc"], 2),
        "smooth_td_var": round(b["td_var"], 4),
        "early_stop_steps": [r.stop_step for r in runs["b"]],
        "early_stop_best_returns": [round(r.best_eval, 1) for r in runs["b"]],
        "early_stop_saved_frac": round(
            float(np.mean([(r.budget - (r.stop_step or r.budget)) / r.budget for r in runs["b"]])),
            3,
        ),
        "early_stop_saved_wall_s": round(
            _mean([ra.wall_s - rb.wall_s for ra, rb in zip(runs["a"], runs["b"], strict=True)]), 2
        )
        if not quick
        else None,
    }
    if with_sb3:
        c = _agg(runs["c"])
        figures.update(
            sb3_wall_s_to_475=round(c["wall_s_to_475"], 3),
            sb3_steps_to_475=round(c["steps_to_475"], 1),
            sb3_solved_seeds=c["solved"],
            sb3_censored=c["censored"],
            sb3_sps=round(c["sps"], 1),
            sb3_auc=round(c["auc"], 2),
            sb3_td_var=round(c["td_var"], 4),
            ratio_vs_sb3=round(a["wall_s_to_475"] / c["wall_s_to_475"], 3),
        )
    return rows, figures


# -- PER ------------------------------------------------------------------------------------


class _LoopSumTree:
    """The classic per-sample Python sum tree (one descent and one update path per item)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tree = np.zeros(2 * capacity - 1)

    def update(self, leaf: int, priority: float) -> None:
        i = leaf + self.capacity - 1
        change = priority - self.tree[i]
        self.tree[i] = priority
        while i:
            i = (i - 1) // 2
            self.tree[i] += change

    def get(self, value: float) -> int:
        i = 0
        while True:
            left = 2 * i + 1
            if left >= len(self.tree):
                return i - self.capacity + 1
            if value <= self.tree[left]:
                i = left
            else:
                value -= self.tree[left]
                i = left + 1


def bench_per(
    capacity: int = 1_000_000, batch: int = 256, iters: int = 2000, seed: int = 0
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Time sample + priority update of `batch` from a full memory of `capacity` transitions."""
    from agentrl.offpolicy.replay import PrioritizedReplay, ReplayBuffer

    rng = np.random.default_rng(seed)
    obs_dim = 4

    def fill(buf: ReplayBuffer) -> None:
        chunk = 100_000
        for _ in range(0, capacity, chunk):
            n = min(chunk, capacity - len(buf)) or chunk
            buf.add(
                rng.random((n, obs_dim), dtype=np.float32),
                rng.integers(0, 2, n),
                rng.random(n, dtype=np.float32),
                rng.random((n, obs_dim), dtype=np.float32),
                np.zeros(n, np.float32),
                np.full(n, 0.99, np.float32),
            )

    per = PrioritizedReplay(capacity, (obs_dim,), alpha=0.6, seed=seed)
    fill(per)
    per.update_priorities(np.arange(capacity), rng.standard_normal(capacity))
    td = rng.standard_normal((16, batch))

    def time_per() -> tuple[float, float, float]:
        t_sample = t_update = 0.0
        for i in range(iters):
            t0 = time.perf_counter()
            b = per.sample(batch, beta=0.5)
            t1 = time.perf_counter()
            per.update_priorities(b.indices, td[i % 16])
            t2 = time.perf_counter()
            t_sample += t1 - t0
            t_update += t2 - t1
        return t_sample / iters * 1e3, t_update / iters * 1e3, (t_sample + t_update) / iters * 1e3

    time_per()  # warm-up
    s_ms, u_ms, total_ms = time_per()

    uni = ReplayBuffer(capacity, (obs_dim,), seed=seed)
    fill(uni)
    t0 = time.perf_counter()
    for _ in range(iters):
        uni.sample(batch)
    uni_ms = (time.perf_counter() - t0) / iters * 1e3
    del uni

    loop = _LoopSumTree(capacity)
    loop.tree[capacity - 1 :] = rng.random(capacity) + 0.01
    for lvl_start in range(capacity - 2, -1, -1):
        loop.tree[lvl_start] = loop.tree[2 * lvl_start + 1] + loop.tree[2 * lvl_start + 2]
    loop_iters = max(10, iters // 20)
    t0 = time.perf_counter()
    for _ in range(loop_iters):
        seg = loop.tree[0] / batch
        leaves = [loop.get((j + rng.random()) * seg) for j in range(batch)]
        for leaf, p in zip(leaves, rng.random(batch) + 0.01, strict=True):
            loop.update(leaf, float(p))
    loop_ms = (time.perf_counter() - t0) / loop_iters * 1e3

    rows = [
        {
            "memory": "agentrl PrioritizedReplay (vectorised sum tree)",
            "sample ms": s_ms,
            "update ms": u_ms,
            "sample+update ms": total_ms,
        },
        {
            "memory": "agentrl ReplayBuffer (uniform)",
            "sample ms": uni_ms,
            "update ms": 0.0,
            "sample+update ms": uni_ms,
        },
        {
            "memory": "per-sample Python sum tree (classic)",
            "sample ms": float("nan"),
            "update ms": float("nan"),
            "sample+update ms": loop_ms,
        },
    ]
    figures = {
        "capacity": capacity,
        "batch": batch,
        "per_sample_ms": round(s_ms, 4),
        "per_update_ms": round(u_ms, 4),
        "per_sample_update_ms": round(total_ms, 4),
        "uniform_sample_ms": round(uni_ms, 4),
        "python_loop_sample_update_ms": round(loop_ms, 3),
        "speedup_vs_python_loop": round(loop_ms / total_ms, 1),
        "goal_ms": 0.3,
        "meets_goal": total_ms <= 0.3,
    }
    return rows, figures


def command(cfg: DqnBench) -> None:
    """`agentrl bench dqn`: one line per run, the table and the JSON line."""
    from rich.console import Console

    from agentrl.bench.report import report

    console = Console()

    def on_run(r: RunFigures) -> None:
        solved = (
            f"solved at {r.solved_step} steps / {r.solved_wall_s:.1f}s"
            if r.solved_step
            else "not solved"
        )
        console.print(
            f"  seed {r.seed} {r.agent}: {solved}; ran {r.env_steps} steps in {r.wall_s:.1f}s"
        )

    with console.status("running agents..."):
        rows, figures = bench_dqn(
            cfg.config, seeds=cfg.seeds, quick=cfg.quick, with_sb3=cfg.sb3, on_run=on_run
        )
    report("offpolicy-dqn-cartpole", rows, figures, Console(width=max(console.width, 160)))


def per_command(cfg: PerBench) -> None:
    """`agentrl bench per`: the table and the JSON line."""
    from rich.console import Console

    from agentrl.bench.report import report

    console = Console()
    with console.status("filling the memory and timing..."):
        rows, figures = bench_per(cfg.capacity, cfg.batch, cfg.iters)
    report("offpolicy-per", rows, figures, Console(width=max(console.width, 120)))
