"""Commands of the llm package: `agentrl learn` (the stand-alone learner), `agentrl train-sft`
and the retired `agentrl train-policy`. Heavy imports (torch, transformers) happen inside the
commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from agentrl.core.configcli import config_command
from agentrl.learners.options import LearnOptions, PolicyOptions, SFTOptions


def register(app: typer.Typer) -> None:
    policy = config_command(PolicyOptions, list(PolicyOptions.model_fields), _train_policy)
    app.command("train-policy", hidden=True, deprecated=True)(policy)
    app.command("train-sft")(config_command(SFTOptions, list(SFTOptions.model_fields), _train_sft))
    app.command("learn")(config_command(LearnOptions, list(LearnOptions.model_fields), _learn))


def _train_policy(cfg: PolicyOptions) -> None:
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
    import dataclasses
    import os
    import sys

    if cfg.nproc > 1 and "WORLD_SIZE" not in os.environ:
        from agentrl.llm.distributed import CLI_ARGV_ENV, torchrun

        os.environ[CLI_ARGV_ENV] = json.dumps(sys.argv[1:])
        proc = torchrun("agentrl", [], cfg.nproc, capture=False)  # agentrl/__main__.py
        raise typer.Exit(proc.returncode)

    from agentrl.learners.onpolicy import LoopSettings, run_training
    from agentrl.llm.config import TrainerConfig

    # the options named like the trainer's and the loop's settings are theirs
    trainer = cfg.model_dump(include=set(TrainerConfig.model_fields) - {"storage_path"})
    config = TrainerConfig(
        **trainer,
        distributed=int(os.environ.get("WORLD_SIZE", "1")) > 1,
        storage_path=cfg.storage_path or str(cfg.out / "checkpoints"),
        storage_options={"endpoint_url": cfg.s3_endpoint} if cfg.s3_endpoint else {},
    )
    loop_fields = {f.name for f in dataclasses.fields(LoopSettings)}
    loop = LoopSettings(env_id=cfg.env, out_dir=cfg.out, **cfg.model_dump(include=loop_fields))
    result = run_training(config, loop, show_progress=True)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result.summary(), default=float))


def _train_sft(cfg: SFTOptions) -> None:
    """Warm start for free-form generation: supervised fine-tuning on BFS demonstrations
    (the worker's own prompts, egocentric observations), with greedy held-out success and
    invalid-action rate before and after. The checkpoint continues with `agentrl
    train-policy --model OUT/checkpoints/final`. Last line: one JSON object.

    Example: agentrl train-sft --train-maps 24 --epochs 2
    """
    from agentrl.learners.sft import SFTSettings, run_sft_job
    from agentrl.llm.config import TrainerConfig

    config = TrainerConfig(
        **cfg.model_dump(include={"model", "lora_r", "learning_rate", "batch_size", "seed"}),
        storage_path=str(cfg.out / "checkpoints"),
        mixed_precision="bf16",  # SFT has no behaviour/training ratio to keep exact
    )
    rest = cfg.model_dump(exclude={"env", "out", "model", "lora_r", "learning_rate"})
    settings = SFTSettings(env_id=cfg.env, out_dir=cfg.out, **rest)
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


def _learn(cfg: LearnOptions) -> None:
    """The stand-alone learner (no stack): train SmolLM2 with the shipped valid-action
    configuration on text FrozenLake and compare it with its base on held-out maps (table, PNG, and a last JSON
    line with base_heldout_success, trained_heldout_success, heldout_seeds, wall_s).

    Example: agentrl learn --config configs/frozenlake-valid-action.yaml
    """
    from rich.console import Console

    from agentrl.core.logs import log_to_file
    from agentrl.learners.learn import run_learn
    from agentrl.llm.config import is_tooluse_config

    console = Console(stderr=True)

    def log_in(out_dir: str | Path) -> None:  # records, warnings, bars: OUT/learn.log
        console.print(f"log: {log_to_file(Path(out_dir) / 'learn.log')}", highlight=False)

    if is_tooluse_config(cfg.config):  # configs/tooluse-*.yaml: Agent Zero JSON tool use
        from agentrl.learners.tooluse import ToolUseConfig, run_main

        tooluse: dict[str, Any] = {"model": cfg.model, "seed": cfg.seed, "out_dir": cfg.out}
        tooluse.update(iterations=cfg.iterations, rl_time_budget_s=cfg.time_budget_s)
        tooluse["data_program"] = cfg.data_program  # None: the config's
        if cfg.heldout_seeds:
            tooluse["heldout_per_family"] = -(-cfg.heldout_seeds // 3)
        log_in(ToolUseConfig.from_file(cfg.config, **tooluse).out_dir)
        run_main(cfg.config, tooluse, console)
        return
    if cfg.data_program is not None:
        typer.echo(
            f"error: data_program is a tool-use setting; {cfg.config} is not a tool-use "
            "config (configs/tooluse-*.yaml)",
            err=True,
        )
        raise typer.Exit(2)
    overrides = {**cfg.model_dump(exclude={"config", "out", "data_program"}), "out_dir": cfg.out}
    from agentrl.learners.valid_action import ValidActionConfig

    log_in(ValidActionConfig.from_file(cfg.config, **overrides).out_dir)
    run_learn(cfg.config, overrides, console)
