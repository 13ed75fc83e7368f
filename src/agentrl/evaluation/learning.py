"""`agentrl bench learning`: GiGPO vs GRPO with equal episode budgets, several seeds.

Both algorithms get the same model, prompts, task seeds, iterations x tasks x group size
episodes, learning rate and update schedule; only the advantage differs. The figure is
the rollout success rate per iteration (mean over seeds), per environment.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.learners.onpolicy import LoopSettings, run_training
from agentrl.llm.config import TrainerConfig

# Short prompts keep CPU prefill cheap; the observation carries the legend and the grid.
SHORT_PROMPTS = {
    "frozenlake": "Reach G without stepping on H. Answer with one word: up, down, left or right.",
    "sokoban": "Push the box X onto the target O. Answer with one word: up, down, left or right.",
    "tooluse": None,
}
# A small model mostly answers with prose at first; the same penalty for both algorithms
# gives them a signal before the first success (verl-agent does the same).
INVALID_ACTION_PENALTY = -0.1
ALGOS = ("gigpo", "grpo")


def _prompt(env_id: str) -> str | None:
    for family, prompt in SHORT_PROMPTS.items():
        if env_id.startswith(family):
            return prompt
    return None


def run_learning_benchmark(
    envs: list[str],
    seeds: int = 3,
    iterations: int = 6,
    tasks_per_iteration: int = 4,
    group_size: int = 4,
    max_steps: int = 6,
    model: str = "smollm2",
    learning_rate: float = 2e-4,
    max_new_tokens: int = 16,
    out_dir: Path = Path("runs/bench-learning"),
    lora_r: int = 16,
    temperature: float = 0.8,
    batch_size: int = 8,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    curves: dict[str, dict[str, list[list[float]]]] = {}
    invalid: dict[str, dict[str, list[list[float]]]] = {}
    seconds: dict[str, float] = {}
    for env_id in envs:
        curves[env_id] = {a: [] for a in ALGOS}
        invalid[env_id] = {a: [] for a in ALGOS}
        for seed in range(seeds):
            for algo in ALGOS:
                cfg = TrainerConfig(
                    algorithm=algo,
                    model=model,
                    lora_r=lora_r,
                    learning_rate=learning_rate,
                    batch_size=batch_size,
                    epochs=1,
                    gamma=0.95,
                    history_window=0,
                    temperature=temperature,
                    seed=seed,
                    micro_batch_tokens=4096,
                )
                loop = LoopSettings(
                    env_id=env_id,
                    iterations=iterations,
                    tasks_per_iteration=tasks_per_iteration,
                    group_size=group_size,
                    max_steps=max_steps,
                    max_new_tokens=max_new_tokens,
                    eval_episodes=0,
                    base_seed=1000 * seed,
                    system_prompt=_prompt(env_id),
                    env_kwargs={"invalid_action_penalty": INVALID_ACTION_PENALTY},
                    write_files=False,
                )
                t0 = time.perf_counter()
                res = run_training(cfg, loop, show_progress=True)
                seconds[f"{env_id}/{algo}"] = seconds.get(f"{env_id}/{algo}", 0.0) + (
                    time.perf_counter() - t0
                )
                curves[env_id][algo].append([r.success_rate for r in res.records])
                invalid[env_id][algo].append([r.invalid_action_rate for r in res.records])
    rows: list[dict[str, Any]] = []
    figures: dict[str, Any] = {}
    finals: dict[str, list[float]] = {a: [] for a in ALGOS}
    for env_id, by_algo in curves.items():
        for algo, runs in by_algo.items():
            arr = np.array(runs)
            # "final": the mean of the last two iterations (one iteration is few episodes).
            final = float(arr[:, -2:].mean()) if arr.shape[1] >= 2 else float(arr[:, -1].mean())
            first = float(arr[:, 0].mean())
            finals[algo].append(final)
            inv = np.array(invalid[env_id][algo])
            rows.append(
                {
                    "env": env_id,
                    "algorithm": algo,
                    "first-iter success": first,
                    "final success": final,
                    "first-iter invalid": float(inv[:, 0].mean()),
                    "final invalid": float(inv[:, -1].mean()),
                    "seeds": arr.shape[0],
                    "episodes/run": iterations * tasks_per_iteration * group_size,
                    "wall s (all seeds)": seconds[f"{env_id}/{algo}"],
                }
            )
            key = env_id.replace("-", "_")
            figures[f"{key}_{algo}_final_success"] = final
            figures[f"{key}_{algo}_curve"] = arr.mean(axis=0).round(4).tolist()
            figures[f"{key}_{algo}_invalid_curve"] = inv.mean(axis=0).round(4).tolist()
    figures["gigpo_final_success"] = float(np.mean(finals["gigpo"]))
    figures["grpo_final_success"] = float(np.mean(finals["grpo"]))
    figures.update(
        model=model,
        seeds=seeds,
        iterations=iterations,
        episodes_per_iteration=tasks_per_iteration * group_size,
        max_steps=max_steps,
        learning_rate=learning_rate,
        lora_r=lora_r,
        temperature=temperature,
        batch_size=batch_size,
        invalid_action_penalty=INVALID_ACTION_PENALTY,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    figures["png"] = str(_plot(curves, out_dir / "learning_gigpo_vs_grpo.png"))
    figures["invalid_png"] = str(
        _plot(invalid, out_dir / "learning_invalid_rate.png", "invalid-action rate")
    )
    (out_dir / "learning.json").write_text(
        json.dumps({"curves": curves, "invalid": invalid, **figures}, indent=2)
    )
    return rows, figures


def _plot(
    curves: dict[str, dict[str, list[list[float]]]],
    path: Path,
    ylabel: str = "rollout success rate",
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.5), squeeze=False)
    for ax, (env_id, by_algo) in zip(axes[0], curves.items(), strict=True):
        for algo, runs in by_algo.items():
            arr = np.array(runs)
            x = np.arange(1, arr.shape[1] + 1)
            mean, std = arr.mean(axis=0), arr.std(axis=0)
            ax.plot(x, mean, marker="o", label=f"{algo} (n={arr.shape[0]})")
            ax.fill_between(x, mean - std, mean + std, alpha=0.2)
        ax.set_title(env_id)
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.02, 1.02)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
