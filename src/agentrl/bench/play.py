"""`agentrl bench play`: the learners' in-process tool-use play with its prefix cache and
without it, side by side on the same held-out tasks (`PlayBench`)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

from agentrl.bench.options import PlayBench

SIDES = {"cache": None, "no_cache": 0.0}  # PlaySettings.cache_mb: None keeps the default


def _side(
    learner: Any, cfg: PlayBench, tasks: list[tuple[str, int]], cache_mb: float | None
) -> tuple[dict[str, Any], list[Any]]:
    """One play of `tasks`; its figures and the episodes."""
    import torch

    from agentrl.learners.tooluse_episodes import PlaySettings, PlayTiming, play

    settings = PlaySettings(
        temperature=cfg.temperature,
        max_steps=cfg.max_steps,
        max_new_tokens=cfg.max_new_tokens,
        batch_size=cfg.batch_size,
        structured=learner.config.structured,
    )
    if cache_mb is not None:
        settings.cache_mb = cache_mb
    timing = PlayTiming()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    episodes = play(
        learner.model,
        learner.tokenizer,
        tasks,
        settings,
        matchers=learner.matchers,
        generator=torch.Generator().manual_seed(cfg.seed),
        timing=timing,
    )
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    st = timing.stats
    return {
        "cpu_s": round(cpu, 1),
        "cpu_s_per_episode": round(cpu / len(episodes), 2),
        "wall_s": round(wall, 1),
        "turns": timing.turns,
        "reply_tokens": timing.tokens,
        "prefill_tokens": st.prefill_tokens,
        "cached_tokens": st.cached_tokens,
        "decode_steps": st.decode_steps,
        "success": sum(e.success for e in episodes),
    }, episodes


def run_play(cfg: PlayBench) -> dict[str, Any]:
    import torch

    from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner

    torch.set_num_threads(1)
    learner = ToolUseLearner(
        ToolUseConfig(
            model=cfg.model,
            threads=1,
            max_steps=cfg.max_steps,
            max_new_tokens=cfg.max_new_tokens,
            batch_size=cfg.batch_size,
            heldout_per_family=cfg.tasks_per_family,
            out_dir=tempfile.mkdtemp(prefix="agentrl-bench-play-"),
        )
    )
    tasks = learner.config.heldout()
    out: dict[str, Any] = {"model": cfg.model, "episodes": len(tasks),
                           "temperature": cfg.temperature}  # fmt: skip
    played: dict[str, list[Any]] = {}
    for name, cache_mb in SIDES.items():
        figures, played[name] = _side(learner, cfg, tasks, cache_mb)
        out.update({f"{k}_{name}": v for k, v in figures.items()})
    out["cpu_speedup"] = round(out["cpu_s_no_cache"] / max(out["cpu_s_cache"], 1e-9), 2)
    if cfg.temperature == 0:
        out["same_tokens"] = all(
            [t.action_ids for t in a.turns] == [t.action_ids for t in b.turns]
            for a, b in zip(played["cache"], played["no_cache"], strict=True)
        )
    out["load_1m"] = round(os.getloadavg()[0], 2)
    return out


def table(out: dict[str, Any]) -> str:
    keys = ("cpu_s_per_episode", "wall_s", "prefill_tokens", "cached_tokens", "decode_steps",
            "success")  # fmt: skip
    lines = [f"{'':22} {'cache':>10} {'no cache':>10}"]
    lines += [f"{k:22} {out[f'{k}_cache']!s:>10} {out[f'{k}_no_cache']!s:>10}" for k in keys]
    lines.append(f"CPU speed-up {out['cpu_speedup']}x on {out['episodes']} episodes")
    return "\n".join(lines)


def command(cfg: PlayBench) -> None:
    """`agentrl bench play`: the table, then one JSON line."""
    out = run_play(cfg)
    print(table(out))
    print(json.dumps(out))
