"""Commands of the llm package: `agentrl train-policy`, `agentrl bench trainer`,
`agentrl bench learning`. Heavy imports (torch, transformers) happen inside the commands."""

from __future__ import annotations

import json
from pathlib import Path

import typer

ALGOS = "gigpo|grpo|rloo|ppo|dpo"


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @app.command("train-policy")
    def train_policy(
        env: str = typer.Option(
            "frozenlake-4x4",
            help="Text environment: sokoban, frozenlake-4x4, frozenlake-8x8, tooluse.",
        ),
        algorithm: str = typer.Option("gigpo", help=f"Update rule: {ALGOS}."),
        model: str = typer.Option(
            "smollm2",
            help="'smollm2' (bundled, no download), 'tiny' (random, for smoke runs), a Hugging "
            "Face id or a local folder (also a checkpoint folder with LoRA adapters).",
        ),
        iterations: int = typer.Option(10, min=1, help="Rollout + update rounds."),
        tasks_per_iteration: int = typer.Option(4, min=1, help="Distinct task seeds per round."),
        group_size: int = typer.Option(
            4, min=1, help="Episodes per task seed (the GRPO/GiGPO group)."
        ),
        max_steps: int = typer.Option(8, min=1, help="Step limit of an episode."),
        max_new_tokens: int = typer.Option(24, min=1, help="Generated tokens per action."),
        temperature: float = typer.Option(1.0, min=0.01, help="Sampling temperature of rollouts."),
        history_window: int = typer.Option(2, min=0, help="Past turns the policy sees."),
        lora_r: int = typer.Option(16, min=0, help="LoRA rank; 0 trains all weights."),
        learning_rate: float = typer.Option(2e-4, min=0.0, help="AdamW learning rate."),
        batch_size: int = typer.Option(32, min=1, help="Steps (samples) per optimiser step."),
        epochs: int = typer.Option(1, min=1, help="Passes over each round's samples."),
        kl_coef: float = typer.Option(0.0, min=0.0, help="k3 KL penalty to the reference."),
        seed: int = typer.Option(0, help="Seeds model init, task seeds and sampling."),
        out: Path = typer.Option(Path("runs/train-policy"), help="Curve PNG + metrics JSON."),
        storage_path: str = typer.Option(
            "", help="Checkpoints: a folder or s3://bucket/prefix (default: OUT/checkpoints)."
        ),
        s3_endpoint: str = typer.Option("", help="S3/MinIO endpoint URL for s3:// paths."),
        save_interval: int = typer.Option(50, min=1, help="Optimiser steps between checkpoints."),
        max_checkpoints: int = typer.Option(3, min=1, help="Step checkpoints kept (rotation)."),
        eval_episodes: int = typer.Option(
            8, min=0, help="Greedy holdout episodes per round, for best/ (0: off)."
        ),
        resume: bool = typer.Option(False, help="Resume from the latest checkpoint."),
        nproc: int = typer.Option(
            1,
            min=1,
            help="Processes for DistributedDataParallel (relaunches under torchrun; gloo on "
            "CPU, nccl on GPU). Each rank rolls out its own tasks; all share the samples.",
        ),
    ) -> None:
        """Train a policy LLM on a text environment: roll out groups of episodes with the
        current model, compute advantages (GiGPO/GRPO/RLOO; GAE for PPO; best-vs-worst pairs
        for DPO), update, repeat. Prints success rate and reward per iteration, writes a PNG
        learning curve and checkpoints (step-N/, best/, final/).

        Example: agentrl train-policy --env frozenlake-4x4 --algorithm gigpo --model smollm2
        --iterations 10
        """
        import os
        import sys

        if nproc > 1 and "WORLD_SIZE" not in os.environ:
            from agentrl.llm.ddp_main import CLI_ARGV_ENV
            from agentrl.llm.distributed import torchrun

            # The command line travels in the environment: torchrun's own parser would
            # otherwise take options such as --nproc as abbreviations of its own.
            os.environ[CLI_ARGV_ENV] = json.dumps(sys.argv[1:])
            proc = torchrun("agentrl.llm.ddp_main", [], nproc, capture=False)
            raise typer.Exit(proc.returncode)

        from agentrl.llm.config import TrainerConfig
        from agentrl.llm.loop import LoopSettings, run_training

        config = TrainerConfig(
            distributed=int(os.environ.get("WORLD_SIZE", "1")) > 1,
            algorithm=algorithm,
            model=model,
            lora_r=lora_r,
            learning_rate=learning_rate,
            batch_size=batch_size,
            epochs=epochs,
            kl_coef=kl_coef,
            temperature=temperature,
            history_window=history_window,
            seed=seed,
            save_interval=save_interval,
            max_checkpoints=max_checkpoints,
            storage_path=storage_path or str(out / "checkpoints"),
            storage_options={"endpoint_url": s3_endpoint} if s3_endpoint else {},
        )
        loop = LoopSettings(
            env_id=env,
            iterations=iterations,
            tasks_per_iteration=tasks_per_iteration,
            group_size=group_size,
            max_steps=max_steps,
            max_new_tokens=max_new_tokens,
            eval_episodes=eval_episodes,
            resume=resume,
            out_dir=out,
        )
        result = run_training(config, loop, show_progress=True)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(result.summary(), default=float))

    @app.command("train-sft")
    def train_sft(
        model: str = typer.Option("smollm2", help="'smollm2', 'tiny', a HF id or a folder."),
        env: str = typer.Option("frozenlake-4x4", help="Non-slippery FrozenLake (BFS expert)."),
        obs_format: str = typer.Option("egocentric", help="grid or egocentric observations."),
        train_maps: int = typer.Option(24, min=1, help="Maps the expert demonstrates."),
        heldout_maps: int = typer.Option(50, min=1, help="Held-out maps, before and after."),
        epochs: int = typer.Option(2, min=1, help="Passes over the demonstrations."),
        batch_size: int = typer.Option(16, min=1, help="Demonstration steps per update."),
        learning_rate: float = typer.Option(5e-4, min=0.0, help="AdamW learning rate."),
        lora_r: int = typer.Option(16, min=0, help="LoRA rank; 0 trains all weights."),
        max_steps: int = typer.Option(8, min=1, help="Step limit of a held-out episode."),
        max_new_tokens: int = typer.Option(6, min=1, help="Generated tokens per action."),
        seed: int = typer.Option(0, help="Seeds model init, map seeds and shuffling."),
        out: Path = typer.Option(Path("runs/sft"), help="Checkpoint (OUT/checkpoints/final)."),
    ) -> None:
        """Warm start for free-form generation: supervised fine-tuning on BFS demonstrations
        (the worker's own prompts, egocentric observations), with greedy held-out success and
        invalid-action rate before and after. The checkpoint continues with `agentrl
        train-policy --model OUT/checkpoints/final`. Last line: one JSON object.

        Example: agentrl train-sft --train-maps 24 --epochs 2
        """
        from agentrl.llm.config import TrainerConfig
        from agentrl.llm.sft import SFTSettings, run_sft_job

        config = TrainerConfig(
            model=model,
            lora_r=lora_r,
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
            storage_path=str(out / "checkpoints"),
            mixed_precision="bf16",  # SFT has no behaviour/training ratio to keep exact
        )
        settings = SFTSettings(
            env_id=env,
            obs_format=obs_format,
            train_maps=train_maps,
            heldout_maps=heldout_maps,
            epochs=epochs,
            batch_size=batch_size,
            max_steps=max_steps,
            max_new_tokens=max_new_tokens,
            seed=seed,
            out_dir=out,
        )
        result = run_sft_job(config, settings)
        b, a = result["before"], result["after"]
        print(f"{'':24}{'before':>10}{'after':>10}")
        print(f"{'held-out success':24}{b['success']:>10.2f}{a['success']:>10.2f}")
        print(
            f"{'invalid-action rate':24}{b['invalid_action_rate']:>10.2f}"
            f"{a['invalid_action_rate']:>10.2f}"
        )
        print(f"{'mean steps':24}{b['mean_steps']:>10.1f}{a['mean_steps']:>10.1f}")
        print(
            f"{'demo log-prob / token':24}{result['demo_logprob_before']:>10.3f}"
            f"{result['demo_logprob_after']:>10.3f}"
        )
        print(
            f"{result['demonstrations']} demonstration steps, {result['optimizer_steps']} "
            f"updates in {result['train_s']:.0f} s; evaluation {result['eval_s']:.0f} s"
        )
        print(json.dumps(result, default=float))

    @app.command("learn")
    def learn(
        config: Path = typer.Option(
            Path("configs/frozenlake-valid-action.yaml"), help="A valid-action learning config."
        ),
        iterations: int = typer.Option(None, min=1, help="Override the config's iterations."),
        algorithm: str = typer.Option(None, help="Override: gigpo, grpo, rloo or ppo."),
        model: str = typer.Option(None, help="Override: 'smollm2', 'tiny', a HF id or folder."),
        heldout_seeds: int = typer.Option(None, min=1, help="Override: held-out maps."),
        time_budget_s: float = typer.Option(None, min=1, help="Override: training seconds."),
        seed: int = typer.Option(None, help="Override the config's seed."),
        out: str = typer.Option(None, help="Override: output folder (adapter, PNG, JSON)."),
    ) -> None:
        """The main job: train SmolLM2 with the shipped valid-action configuration on text
        FrozenLake and compare it with its base on held-out maps (table, PNG, and a last JSON
        line with base_heldout_success, trained_heldout_success, heldout_seeds, wall_s).

        Example: agentrl learn --config configs/frozenlake-valid-action.yaml
        """
        from rich.console import Console

        from agentrl.llm.main_job import run_main_job

        if _is_tooluse_config(config):  # configs/tooluse-*.yaml: Agent Zero JSON tool use
            from agentrl.llm.tooluse import run_main

            tooluse = {"model": model, "seed": seed, "out_dir": out, "iterations": iterations}
            tooluse["rl_time_budget_s"] = time_budget_s
            if heldout_seeds:
                tooluse["heldout_per_family"] = -(-heldout_seeds // 3)
            run_main(config, tooluse, Console(stderr=True))
            return
        overrides = {
            "iterations": iterations,
            "algorithm": algorithm,
            "model": model,
            "heldout_seeds": heldout_seeds,
            "time_budget_s": time_budget_s,
            "seed": seed,
            "out_dir": out,
        }
        run_main_job(config, overrides, Console(stderr=True))

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
        from agentrl.llm.bench_trainer import CASES, run_trainer_benchmark

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
        """GiGPO vs GRPO vs RLOO at equal episode budgets, >= 5 seeds: FrozenLake 4x4 (the
        main job's configuration: base/trained held-out success, seconds to 0.7), a
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

        from agentrl.llm import bench_compare as bc

        console = Console(stderr=True, width=220)

        def say(msg: str) -> None:
            print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

        if settings.strip() == "tooluse":  # Agent Zero JSON tool use: agentrl.llm.tooluse
            from agentrl.llm.tooluse_bench import bench_tooluse

            tooluse_config = config
            if not _is_tooluse_config(config):
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
        from agentrl.llm.bench_learning import run_learning_benchmark

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


def _is_tooluse_config(path: Path) -> bool:
    """A tool-use learning config: named tooluse-*.yaml or saying `kind: tooluse`."""
    if path.name.startswith("tooluse"):
        return True
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and data.get("kind") == "tooluse"
