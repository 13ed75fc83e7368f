"""`agentrl learn`: the stand-alone learning run (no stack; the main job is `agentrl loop`).
Train the shipped valid-action configuration and show the trained model against its base on
the same held-out maps.

Prints one line per iteration, the base-vs-trained table (success with a 95 % Wilson
interval, mean reward, invalid-action rate, mean steps), where the time went, the machine
load, and as its LAST line one JSON object: base_heldout_success, trained_heldout_success,
heldout_seeds, wall_s.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = Path("configs/frozenlake-valid-action.yaml")


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def run_learn(config_path: Path, overrides: dict[str, Any], console: Any) -> dict[str, Any]:
    from rich.table import Table

    from agentrl.learners.valid_action import IterationStats, ValidActionConfig, train_on_env

    t0 = time.perf_counter()
    config = ValidActionConfig.from_file(config_path, **overrides)
    console.print(
        f"[bold]learning[/]: {config.algorithm} on {config.env_id} ({config.obs_format} "
        f"observations, valid-action policy), model {config.model}, LoRA r={config.lora_r} on "
        f"the top {config.lora_layers} layers, {config.dtype}; {config.iterations} iterations of "
        f"{config.maps_per_iteration} maps x {config.episodes_per_map} episodes; "
        f"{config.heldout_seeds} held-out maps. Load before: {load_average()}"
    )

    def show(rec: IterationStats) -> None:
        ev = "" if rec.heldout_success is None else f"  held-out {rec.heldout_success:.2f}"
        console.print(
            f"iter {rec.iteration:3d}  success {rec.train_success:.2f}  return "
            f"{rec.train_return:+.2f}  entropy {rec.entropy:.2f}  prompts {rec.distinct_prompts}"
            f" (scored {rec.prompts_scored}) of {rec.steps} steps  ({rec.rollout_s:.1f}s rollout,"
            f" {rec.update_s:.1f}s update){ev}"
        )

    result = train_on_env(config, on_iteration=show)
    wall = time.perf_counter() - t0
    table = Table(title=f"held-out greedy evaluation, {result.base.seeds} maps never trained on")
    for col in ("model", "success [95% CI]", "mean reward", "invalid actions", "mean steps"):
        table.add_column(col)
    for name, st in (("base", result.base), ("trained", result.trained)):
        table.add_row(
            name,
            f"{st.success:.2f} [{st.ci_low:.2f}, {st.ci_high:.2f}]",
            f"{st.mean_reward:+.3f}",
            f"{st.invalid_action_rate:.0%}",
            f"{st.mean_steps:.1f}",
        )
    console.print(table)
    t = result.timing
    console.print(
        f"time: load {result.load_s:.0f}s, evaluation {result.eval_s:.0f}s, training "
        f"{result.train_s:.0f}s (rollouts {t['rollout_s']:.0f}s, updates {t['update_s']:.0f}s, "
        f"held-out curve {t['periodic_eval_s']:.0f}s, frozen-trunk cache "
        f"{t['trunk_cache_s']:.0f}s); prompts scored {t['prompt_cache_misses']:.0f} for "
        f"{t['prompt_cache_hits'] + t['prompt_cache_misses']:.0f} steps; whole run {wall:.0f}s"
    )
    console.print(f"load after: {load_average()}")
    console.print(f"adapter: {result.adapter_dir}   curve: {result.curve_png}")
    details = {
        "train_s": round(result.train_s, 1),
        "iterations": len(result.iterations),
        "base_ci": [result.base.ci_low, result.base.ci_high],
        "trained_ci": [result.trained.ci_low, result.trained.ci_high],
        "load": load_average(),
        "curve_png": result.curve_png,
    }
    print(json.dumps(details), flush=True)
    last = {
        "base_heldout_success": result.base.success,
        "trained_heldout_success": result.trained.success,
        "heldout_seeds": result.base.seeds,
        "wall_s": round(wall, 1),
    }
    print(json.dumps(last), flush=True)
    return last
