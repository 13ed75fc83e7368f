"""`agentrl bench trainer|learning|learning-freeform`: what measures learning (the trainers
and learners themselves live in `agentrl.llm`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

ALGOS = "gigpo|grpo|rloo|ppo|dpo"


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("trainer")
    def bench_trainer(
        cases: str = typer.Option(
            "tiny,smollm2-full,smollm2-lora",
            help="Comma list of: tiny, smollm2-full, smollm2-lora (SmolLM2 LoRA is the headline).",
        ),
        rounds: int = typer.Option(3, min=1, help="Timed updates per implementation (median)."),
        warmup: int = typer.Option(1, min=0, help="Untimed updates first."),
        threads: int = typer.Option(
            0, min=0, help="torch threads (0: torch's default). 1 is steadier on a busy machine."
        ),
    ) -> None:
        """Tokens/s of one policy-gradient update (forward, backward, clip, AdamW) on 8
        sequences of 100 prompt + 32 action tokens: ours vs TRL's GRPOTrainer loss vs a plain
        PyTorch loop with the LM head on action positions only (the ceiling). Timed in turns
        so machine load hits all three alike."""
        import torch
        from rich.console import Console

        from agentrl.benchmarks.report import report
        from agentrl.evaluation.trainer import CASES, run_trainer_benchmark

        if threads:
            torch.set_num_threads(threads)
        console = Console(stderr=True)
        chosen = [CASES[c.strip()] for c in cases.split(",") if c.strip()]
        rows, figures = run_trainer_benchmark(
            chosen, warmup=warmup, rounds=rounds, progress=lambda m: console.log(m)
        )
        figures["torch_threads"] = torch.get_num_threads()
        report("trainer: policy-gradient update tokens/s", rows, figures)

    @bench.command("learning")
    def bench_learning(
        config: Path = typer.Option(
            Path("configs/frozenlake-valid-action.yaml"), help="The 4x4 learning config."
        ),
        seeds: int = typer.Option(5, min=1, help="Training seeds per algorithm and setting."),
        jobs: int = typer.Option(
            1, min=1, help="Worker processes (seeds split between them, 1 torch thread each)."
        ),
        settings: str = typer.Option(
            "fl4,curriculum,sokoban",
            help="Comma list of: fl4, curriculum, sokoban; or tooluse alone (configs/tooluse-*.yaml).",
        ),
        algorithms: str = typer.Option("gigpo,grpo,rloo", help="Comma list."),
        model: str = typer.Option("", help="Override the model (e.g. a larger one on a GPU)."),
        iterations_scale: float = typer.Option(
            1.0, min=0.01, help="Multiply every setting's iterations (10 for the GPU run)."
        ),
        threads: int = typer.Option(0, min=0, help="torch threads (0: pick by load)."),
        out: Path = typer.Option(Path("runs/bench-learning"), help="Runs, PNG and JSON go here."),
        quick: bool = typer.Option(False, help="A tiny random model and 2 iterations: seconds."),
        collect_only: bool = typer.Option(
            False, help="Run nothing: summarise OUT/runs.jsonl (e.g. after an interruption)."
        ),
        reuse: bool = typer.Option(
            False, help="Reuse the 4x4 runs (adapter + optimiser) saved under OUT/warm."
        ),
        fl4_every_algorithm: bool = typer.Option(
            False,
            help="Run the 4x4 setting from the base for every algorithm (not GiGPO only): "
            "the comparison where learning starts at 0.",
        ),
    ) -> None:
        """GiGPO vs GRPO vs RLOO at equal episode budgets, >= 5 seeds: FrozenLake 4x4 (`agentrl
        learn`'s configuration: base/trained held-out success, seconds to 0.7), a
        curriculum (6x6 maps from each seed's 4x4 adapter) and one-box Sokoban. Final
        held-out success with 95 % intervals (t over seeds, pooled Wilson), wall and CPU
        seconds to 0.5 and 0.7, a PNG per setting. One line per iteration on stderr; the
        last stdout line is one JSON object (base_success, trained_success, seconds_to_070,
        gigpo/grpo/rloo_final_success, gigpo/grpo_seconds_to_050, gigpo/grpo_ci_low/high,
        seeds, wall_s, then extras: cpu_s, load, sokoban_*)."""
        import sys
        import time

        from rich.console import Console
        from rich.table import Table

        from agentrl.evaluation import compare as bc

        console = Console(stderr=True, width=220)

        def say(msg: str) -> None:
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

        if settings.strip() == "tooluse":  # Agent Zero JSON tool use: agentrl.learners.tooluse
            from agentrl.evaluation.tooluse import bench_tooluse

            tooluse_config = config
            from agentrl.llm.config import is_tooluse_config

            if not is_tooluse_config(config):
                tooluse_config = Path("configs/tooluse-rl.yaml")
            extra: dict[str, object] = {"model": model} if model else {}
            if quick:
                extra.update(model="tiny", heldout_per_family=2, warm_tasks_per_family=2)
                extra.update(iterations=1, tasks_per_iteration=3, group_size=2)
                extra.update(max_new_tokens=24, max_steps=2, warm_epochs=1)
            pooled = bench_tooluse(tooluse_config, seeds, out, say, **extra)
            print(json.dumps(pooled), flush=True)
            return
        if quick:
            plan = bc.quick_plan(str(config), str(out))
        else:
            plan = bc.full_plan(str(config), seeds, str(out), threads=threads)
        plan.settings = tuple(s.strip() for s in settings.split(",") if s.strip())
        plan.reuse = reuse
        plan.fl4_every_algorithm = fl4_every_algorithm
        plan.algorithms = tuple(a.strip() for a in algorithms.split(",") if a.strip())
        bad = set(plan.settings) - set(bc.SETTINGS) or set(plan.algorithms) - set(bc.ALGORITHMS)
        if bad:
            raise typer.BadParameter(f"unknown setting or algorithm: {sorted(bad)}")
        if model:
            plan.overrides.setdefault("all", {})["model"] = model
        if iterations_scale != 1.0:
            for name in bc.SETTINGS:
                base = plan.config(name, "gigpo", 0).iterations
                plan.overrides.setdefault(name, {})["iterations"] = max(
                    1, round(base * iterations_scale)
                )
        if collect_only:
            runs = bc.load_runs(out / "runs.jsonl")
            cost = {"wall_s": 0.0, "cpu_s": 0.0, "load_start": bc.load1(), "load_end": bc.load1()}
        else:
            say(f"bench learning: {plan.seeds} seeds, settings {plan.settings}, jobs {jobs}")
            runs, cost = bc.run_plan(plan, jobs, say)
        rows = bc.table_rows(runs, plan)
        table = Table(title=f"bench learning: held-out greedy success, {plan.seeds} seeds")
        for col in rows[0] if rows else []:
            table.add_column(col)
        for row in rows:
            table.add_row(*(str(v) for v in row.values()))
        console.print(table)
        png = bc.plot(runs, plan, out / "learning_compare.png") if runs else None
        line = bc.last_line(runs, cost, plan, jobs)
        summary = {"line": line, "rows": rows, "png": str(png) if png else None}
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        console.print(
            f"wall {cost['wall_s']:.0f}s, cpu {cost['cpu_s']:.0f}s, load "
            f"{cost['load_start']:.2f} -> {cost['load_end']:.2f}; curves: {png}"
        )
        print(json.dumps(line), flush=True)

    @bench.command("learning-freeform")
    def bench_learning_freeform(
        envs: str = typer.Option("frozenlake-4x4,sokoban", help="Comma list of environments."),
        seeds: int = typer.Option(3, min=1, help="Training seeds per algorithm."),
        iterations: int = typer.Option(6, min=1, help="Rollout + update rounds per run."),
        tasks_per_iteration: int = typer.Option(4, min=1),
        group_size: int = typer.Option(4, min=2),
        max_steps: int = typer.Option(6, min=1),
        model: str = typer.Option("smollm2", help="'smollm2' or 'tiny'."),
        learning_rate: float = typer.Option(2e-4, min=0.0),
        max_new_tokens: int = typer.Option(16, min=1),
        temperature: float = typer.Option(0.8, min=0.01, help="Rollout sampling temperature."),
        batch_size: int = typer.Option(8, min=1, help="Samples per optimiser step."),
        out: Path = typer.Option(Path("runs/bench-learning"), help="PNG + JSON go here."),
    ) -> None:
        """GiGPO vs GRPO with equal episode budgets on text FrozenLake and Sokoban: success
        rate per iteration (mean over seeds) for each, as a PNG and JSON. Budgets are small on
        CPU; the figures say what was measured, not what a GPU run would reach."""
        from agentrl.benchmarks.report import report
        from agentrl.evaluation.learning import run_learning_benchmark

        rows, figures = run_learning_benchmark(
            envs=[e.strip() for e in envs.split(",") if e.strip()],
            seeds=seeds,
            iterations=iterations,
            tasks_per_iteration=tasks_per_iteration,
            group_size=group_size,
            max_steps=max_steps,
            model=model,
            learning_rate=learning_rate,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            batch_size=batch_size,
            out_dir=out,
        )
        report("learning: GiGPO vs GRPO", rows, figures)
