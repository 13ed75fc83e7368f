"""The evaluation package's benchmarks: `agentrl bench trainer` (one policy-gradient update,
ours vs TRL vs plain PyTorch), `agentrl bench learning` (GiGPO vs GRPO vs RLOO at equal
budgets) and `agentrl bench learning-freeform` (free-text moves). Their options are
`agentrl.evaluation.options`'s models; the work is `agentrl.evaluation`'s."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import typer

from agentrl.evaluation.options import FreeformBench, LearningBench, TrainerBench


def trainer(cfg: TrainerBench) -> None:
    """`agentrl bench trainer` (its story: `TrainerBench`)."""
    import torch
    from rich.console import Console

    from agentrl.bench.report import report
    from agentrl.evaluation.trainer import CASES, run_trainer_benchmark

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    console = Console(stderr=True)
    names = [c.strip() for c in cfg.cases.split(",") if c.strip()]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise typer.BadParameter(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    rows, figures = run_trainer_benchmark(
        [CASES[c] for c in names],
        warmup=cfg.warmup,
        rounds=cfg.rounds,
        progress=lambda m: console.log(m),
    )
    figures["torch_threads"] = torch.get_num_threads()
    report("trainer: policy-gradient update tokens/s", rows, figures)


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def learning(cfg: LearningBench) -> None:
    """`agentrl bench learning` (its story: `LearningBench`): the table, the PNG, the JSON line."""
    if cfg.settings.strip() == "tooluse":  # Agent Zero JSON tool use: agentrl.learners.tooluse
        _learning_tooluse(cfg)
        return
    from rich.console import Console
    from rich.table import Table

    from agentrl.evaluation import compare as bc

    plan = _learning_plan(cfg)
    if cfg.collect_only:
        runs = bc.load_runs(cfg.out / "runs.jsonl")
        cost = {"wall_s": 0.0, "cpu_s": 0.0, "load_start": bc.load1(), "load_end": bc.load1()}
    else:
        _say(f"bench learning: {plan.seeds} seeds, settings {plan.settings}, jobs {cfg.jobs}")
        runs, cost = bc.run_plan(plan, cfg.jobs, _say)
    rows = bc.table_rows(runs, plan)
    table = Table(title=f"bench learning: held-out greedy success, {plan.seeds} seeds")
    for col in rows[0] if rows else []:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console = Console(stderr=True, width=220)
    console.print(table)
    png = bc.plot(runs, plan, cfg.out / "learning_compare.png") if runs else None
    line = bc.last_line(runs, cost, plan, cfg.jobs)
    summary = {"line": line, "rows": rows, "png": str(png) if png else None}
    (cfg.out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    console.print(
        f"wall {cost['wall_s']:.0f}s, cpu {cost['cpu_s']:.0f}s, load "
        f"{cost['load_start']:.2f} -> {cost['load_end']:.2f}; curves: {png}"
    )
    print(json.dumps(line), flush=True)


def _learning_plan(cfg: LearningBench) -> Any:
    """The comparison's plan: the quick or the recorded one, with the options over it."""
    from agentrl.evaluation import compare as bc

    if cfg.quick:
        plan = bc.quick_plan(str(cfg.config), str(cfg.out))
    else:
        plan = bc.full_plan(str(cfg.config), cfg.seeds, str(cfg.out), threads=cfg.threads or 0)
    plan.settings = tuple(s.strip() for s in cfg.settings.split(",") if s.strip())
    plan.reuse = cfg.reuse
    plan.fl4_every_algorithm = cfg.fl4_every_algorithm
    plan.algorithms = tuple(a.strip() for a in cfg.algorithms.split(",") if a.strip())
    bad = set(plan.settings) - set(bc.SETTINGS) or set(plan.algorithms) - set(bc.ALGORITHMS)
    if bad:
        raise typer.BadParameter(f"unknown setting or algorithm: {sorted(bad)}")
    if cfg.model:
        plan.overrides.setdefault("all", {})["model"] = cfg.model
    if cfg.iterations_scale != 1.0:
        for name in bc.SETTINGS:
            base = plan.config(name, "gigpo", 0).iterations
            plan.overrides.setdefault(name, {})["iterations"] = max(
                1, round(base * cfg.iterations_scale)
            )
    return plan


def _learning_tooluse(cfg: LearningBench) -> None:
    from pathlib import Path

    from agentrl.evaluation.tooluse import bench_tooluse
    from agentrl.llm.config import is_tooluse_config

    config = cfg.config if is_tooluse_config(cfg.config) else Path("configs/tooluse-rl.yaml")
    extra: dict[str, object] = {"model": cfg.model} if cfg.model else {}
    if cfg.quick:
        extra.update(model="tiny", heldout_per_family=2, warm_tasks_per_family=2)
        extra.update(iterations=1, tasks_per_iteration=3, group_size=2)
        extra.update(max_new_tokens=24, max_steps=2, warm_epochs=1)
    pooled = bench_tooluse(config, cfg.seeds, cfg.out, _say, **extra)
    print(json.dumps(pooled), flush=True)


def freeform(cfg: FreeformBench) -> None:
    """`agentrl bench learning-freeform` (its story: `FreeformBench`)."""
    from agentrl.bench.report import report
    from agentrl.evaluation.learning import run_learning_benchmark

    kw = cfg.model_dump(exclude={"envs", "out"})
    envs = [e.strip() for e in cfg.envs.split(",") if e.strip()]
    rows, figures = run_learning_benchmark(envs=envs, out_dir=cfg.out, **kw)
    report("learning: GiGPO vs GRPO", rows, figures)
