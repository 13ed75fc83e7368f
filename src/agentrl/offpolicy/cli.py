"""`agentrl dqn` (`agentrl bench dqn|per` are `agentrl.bench.cli`'s; imports stay light: typer only).

`agentrl dqn`'s options are the top-level keys of the training config (`AGMConfigEntity`:
its docstrings are the help) and how to run it (`agentrl.offpolicy.options.DqnRun`);
`--set SECTION.KEY=VALUE` reaches every key of the YAML (`agentrl.core.configcli`)."""

from __future__ import annotations

from typing import Any

import typer

from agentrl.core.configcli import (
    build,
    flag,
    model_command,
    option_parameters,
    overrides,
)
from agentrl.offpolicy.config import AGMConfigEntity
from agentrl.offpolicy.options import DqnRun

RUN_FLAGS = {"config": ["--config", "-c"], "out": ["--out", "-o"], "metrics_format": ["--format"]}
CONFIG_OPTIONS = ("env_id", "seed", "total_steps", "num_envs")


def register(app: typer.Typer) -> None:
    run = option_parameters(DqnRun, list(DqnRun.model_fields), RUN_FLAGS)
    show = flag("show_config", "Print the resolved training config as JSON and exit.")
    app.command("dqn")(model_command(AGMConfigEntity, CONFIG_OPTIONS, _dqn, [*run, show]))


def _dqn(changes: dict[str, Any], *, show_config: bool, **given: Any) -> None:
    """Train Double DQN with prioritized replay on a gymnasium env with discrete actions.

    Writes OUT/metrics.csv (per log interval), OUT/evals.csv (per evaluation, with
    early-stop decisions), OUT/training.png, OUT/model.pt (final torch state dict),
    OUT/best.pt and OUT/summary.json. Kernel smoothing and early stopping are turned
    on in the config (kernel_smoothing.enabled, early_stopping.enabled), e.g.
    `--set kernel_smoothing.enabled=true`.
    """
    from agentrl.core.errors import ConfigError
    from agentrl.offpolicy.config import load_config

    run = build(DqnRun, overrides(DqnRun, given))
    try:
        cfg = load_config(run.config, **changes)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if show_config:
        typer.echo(cfg.model_dump_json(indent=2))
        return
    _train(cfg, run)


def _train(cfg: AGMConfigEntity, run: DqnRun) -> None:
    """Train `cfg` as `run` says, with a progress bar; write the run's files."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from agentrl.offpolicy.events import EventDispatcher
    from agentrl.offpolicy.metrics import summary, write_run

    console = Console()
    dispatcher = EventDispatcher()
    sink = None
    if run.nats_url:
        from agentrl.offpolicy.events import NatsEventSink

        sink = NatsEventSink.connect(run.nats_url)
        dispatcher.subscribe(sink)
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} steps"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("apex" if run.apex else "dqn", total=cfg.total_steps, info="")

        def progress(steps: int, row: dict[str, float]) -> None:
            ret = row.get("train_return", float("nan"))
            info = (
                f"return {ret:.1f}  |td| {row.get('td_abs_mean', float('nan')):.3g}" if row else ""
            )
            bar.update(task, completed=min(steps, cfg.total_steps), info=info)

        if run.apex:
            from agentrl.offpolicy.apex import ApexTrainer

            trainer = ApexTrainer(cfg, run.actors, dispatcher, ray_address=run.ray_address)
            result = trainer.train(progress)
        else:
            from agentrl.offpolicy.trainer import Trainer

            result = Trainer(cfg, dispatcher).train(progress)
    if sink is not None:
        sink.close()
    paths = write_run(result, run.out, run.metrics_format)
    s = summary(result)
    console.print(
        f"[green]done[/] {s['env_steps']:,} env steps, {s['updates']:,} updates in {s['wall_s']:.1f}s "
        f"({s['sps']} steps/s); best greedy return {s['best_eval_return']}"
    )
    if result.stopped_early:
        console.print(f"early stop at step {result.stop_step}: {result.stop_reason}")
    for name, path in paths.items():
        console.print(f"  {name:<11} {path}")
