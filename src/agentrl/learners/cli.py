"""Commands of the llm package: `agentrl learn` (the stand-alone learner), `agentrl train-sft`
and the retired `agentrl train-policy`. Heavy imports (torch, transformers) happen inside the
commands."""

from __future__ import annotations

import json
from pathlib import Path

import typer

ALGOS = "gigpo|grpo|rloo|ppo|dpo"


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @app.command("train-policy", hidden=True, deprecated=True)
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
        """Retired from the menu: the stand-alone learner is `agentrl learn`, and the training
        service's environment jobs run this same on-policy learner (`agentrl.learners.onpolicy`);
        kept for the scripts that call it.

        Train a policy LLM on a text environment: roll out groups of episodes with the
        current model, compute advantages (GiGPO/GRPO/RLOO; GAE for PPO; best-vs-worst pairs
        for DPO), update, repeat. Prints success rate and reward per iteration, writes a PNG
        learning curve and checkpoints (step-N/, best/, final/).

        Example: agentrl train-policy --env frozenlake-4x4 --algorithm gigpo --model smollm2
        --iterations 10
        """
        import os
        import sys

        if nproc > 1 and "WORLD_SIZE" not in os.environ:
            from agentrl.llm.distributed import CLI_ARGV_ENV, torchrun

            os.environ[CLI_ARGV_ENV] = json.dumps(sys.argv[1:])
            proc = torchrun("agentrl", [], nproc, capture=False)  # agentrl/__main__.py
            raise typer.Exit(proc.returncode)

        from agentrl.learners.onpolicy import LoopSettings, run_training
        from agentrl.llm.config import TrainerConfig

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
        from agentrl.learners.sft import SFTSettings, run_sft_job
        from agentrl.llm.config import TrainerConfig

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
        """The stand-alone learner (no stack): train SmolLM2 with the shipped valid-action
        configuration on text FrozenLake and compare it with its base on held-out maps (table, PNG, and a last JSON
        line with base_heldout_success, trained_heldout_success, heldout_seeds, wall_s).

        Example: agentrl learn --config configs/frozenlake-valid-action.yaml
        """
        from rich.console import Console

        from agentrl.learners.learn import run_learn
        from agentrl.llm.config import is_tooluse_config
        from agentrl.logs import log_to_file

        console = Console(stderr=True)

        def log_in(out_dir: str | Path) -> None:  # records, warnings, bars: OUT/learn.log
            console.print(f"log: {log_to_file(Path(out_dir) / 'learn.log')}", highlight=False)

        if is_tooluse_config(config):  # configs/tooluse-*.yaml: Agent Zero JSON tool use
            from agentrl.learners.tooluse import ToolUseConfig, run_main

            tooluse = {"model": model, "seed": seed, "out_dir": out, "iterations": iterations}
            tooluse["rl_time_budget_s"] = time_budget_s
            if heldout_seeds:
                tooluse["heldout_per_family"] = -(-heldout_seeds // 3)
            log_in(ToolUseConfig.from_file(config, **tooluse).out_dir)
            run_main(config, tooluse, console)
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
        from agentrl.learners.valid_action import ValidActionConfig

        log_in(ValidActionConfig.from_file(config, **overrides).out_dir)
        run_learn(config, overrides, console)
