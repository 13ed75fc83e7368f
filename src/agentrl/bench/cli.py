"""Every `agentrl bench NAME` and `agentrl soak`, as data: one row per benchmark naming its
options model (its docstring the command's help, its fields the options), the function that
runs it (`module:function`, imported only when the command runs, so `agentrl --help` stays
fast) and, for a harness that parses its own arguments, the module whose `main(argv)` gets
them all. A package's own cli knows nothing of its benchmarks."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import typer
from pydantic import BaseModel

from agentrl.bench import options as o
from agentrl.bench.soak_config import SoakConfig
from agentrl.core.configcli import config_command
from agentrl.evaluation.options import FreeformBench, LearningBench, TrainerBench
from agentrl.offpolicy.options import DqnBench, PerBench
from agentrl.rewards.options import RedactionBench, RewardsBench
from agentrl.training.options import TrainingBench
from agentrl.warehouse.options import WarehouseBench

HELP = (
    "Benchmarks. Each prints a readable table and, as its last line, one JSON object of "
    "named figures (record them in BENCHMARKS.md)."
)


@dataclass(frozen=True)
class Bench:
    """One benchmark drawn from its options model. `fields`: those shown as options (the
    others through `--set`; empty: all); `flags`: a field's own flags; `env`: variables set
    (unless set) before `run`'s module is imported."""

    name: str
    options: type[BaseModel]
    run: str
    fields: Sequence[str] = ()
    flags: Mapping[str, Sequence[str]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Harness:
    """A benchmark whose module parses its own arguments (`main(argv)`): every argument,
    `--help` included, goes to it; the help line is the module docstring's first paragraph."""

    name: str
    module: str


ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}

# `agentrl bench --help` lists them in this order
BENCHES: tuple[Bench | Harness, ...] = (
    Bench("bus", o.BusBench, "agentrl.bench.bus:command"),
    Bench("redaction", RedactionBench, "agentrl.bench.redaction:command"),
    Bench(
        "rewards",
        RewardsBench,
        "agentrl.bench.rewards:command",
        fields=("n", "n_code", "url", "replicas"),
    ),
    Bench("gigpo", o.GigpoBench, "agentrl.bench.gigpo:command", env=ONE_THREAD),
    Bench("rollout", o.RolloutBench, "agentrl.bench.rollout:command"),
    Bench("trainer", TrainerBench, "agentrl.bench.evaluation:trainer"),
    Bench("learning", LearningBench, "agentrl.bench.evaluation:learning"),
    Bench("learning-freeform", FreeformBench, "agentrl.bench.evaluation:freeform"),
    Bench("dqn", DqnBench, "agentrl.bench.dqn:command", flags={"config": ["--config", "-c"]}),
    Bench("per", PerBench, "agentrl.bench.dqn:per_command"),
    Bench("training", TrainingBench, "agentrl.bench.training:command"),
    Bench("warehouse", WarehouseBench, "agentrl.bench.warehouse:command", fields=("n", "repeat")),
    Bench("lineages", o.LineagesBench, "agentrl.bench.lineages:command"),
    Bench("canary", o.CanaryBench, "agentrl.bench.canary:command"),
    Bench("gateway", o.GatewayBench, "agentrl.bench.cli:gateway"),
    Bench(
        "structured",
        o.StructuredBench,
        "agentrl.bench.structured:command",
        flags={"n_schemas": ["--schemas"]},
    ),
    Bench("serving", o.ServingBench, "agentrl.bench.serving:command"),
    Bench("metrics", o.MetricsBench, "agentrl.bench.metrics:command"),
    Bench("capture", o.CaptureBench, "agentrl.bench.capture:command"),
    Bench("startup", o.StartupBench, "agentrl.bench.startup:command"),
    Bench("choice", o.ChoiceBench, "agentrl.bench.choice:command"),
    Bench("acting", o.ActingBench, "agentrl.bench.acting:command"),
    Bench("play", o.PlayBench, "agentrl.bench.play:command", env=ONE_THREAD),
    Harness("tooluse-job", "agentrl.bench.tooluse_job"),
    Harness("tooluse-hints", "agentrl.bench.tooluse_hints"),
)

# `agentrl soak`'s options: these fields of `SoakConfig`; `--set FIELD=VALUE` reaches the others
SOAK_OPTIONS = (
    "data_dir",
    "agents",
    "threshold",
    "restart_delay_s",
    "recover_timeout_s",
    "replicas",
    "cluster",
)
SOAK = Bench("soak", SoakConfig, "agentrl.bench.cli:soak", fields=SOAK_OPTIONS)


def register(app: typer.Typer) -> None:
    """`agentrl bench` with a command per row of `BENCHES`, and `agentrl soak`."""
    bench = typer.Typer(help=HELP, no_args_is_help=True)
    app.add_typer(bench, name="bench")
    for row in BENCHES:
        if isinstance(row, Harness):
            _harness(bench, row)
        else:
            bench.command(row.name)(command(row))
    app.command("soak")(command(SOAK))


def command(row: Bench) -> Callable[..., None]:
    """The typer command of a row: its model's options, `row.run` its body."""
    fields = row.fields or list(row.options.model_fields)
    return config_command(row.options, fields, runner(row), flags=row.flags)


def runner(row: Bench) -> Callable[[BaseModel], None]:
    """The command's body: import `row.run` and call it with the validated options."""

    def run(cfg: BaseModel) -> None:
        for name, value in row.env.items():
            os.environ.setdefault(name, value)
        module, _, function = row.run.partition(":")
        getattr(importlib.import_module(module), function)(cfg)

    run.__doc__ = row.options.__doc__
    return run


def _harness(bench: typer.Typer, row: Harness) -> None:
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(row.module)  # its docstring without importing it (torch)
    source = Path(spec.origin).read_text() if spec and spec.origin else ""
    first = (ast.get_docstring(ast.parse(source)) or row.name).split("\n\n")[0]

    def run(ctx: typer.Context) -> None:
        importlib.import_module(row.module).main(list(ctx.args))

    bench.command(
        row.name,
        help=" ".join(first.split()) + " (`--help` lists its options)",
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(run)


# The run functions of the two benchmarks that choose between modules (which import each
# other's helpers, so neither module can hold the choice)


def gateway(cfg: o.GatewayBench) -> None:
    """`agentrl bench gateway`: beside the peers (`agentrl.bench.gateway_peers`), or alone."""
    only = tuple(x for x in cfg.only.split(",") if x)
    if cfg.peers and cfg.interleave:
        from agentrl.bench.gateway_peers import run_interleaved

        rates = tuple(float(x) for x in o.comma_list(cfg.rates))
        run_interleaved(duration=cfg.duration, only=only, rounds=cfg.interleave, rates=rates)
        return
    if cfg.peers:
        from agentrl.bench.gateway_peers import run_peers

        run_peers(duration=cfg.duration, only=only)
        return
    from agentrl.bench.gateway import run_bench

    run_bench(
        duration=cfg.duration,
        model=cfg.model,
        tokens=cfg.tokens,
        period=cfg.period,
        latency_only=cfg.latency_only,
        repeat=cfg.repeat,
    )


def soak(cfg: SoakConfig) -> None:
    """`agentrl soak`: refuse a folder in use, log to it, run the soak (replicated with
    --replicas), print the table and one JSON line; exit status 1 if a check failed."""
    import asyncio
    import sys

    from agentrl.bench.soak import LOG_FILE, main_json, run_soak, table
    from agentrl.core.logs import log_to_file

    def say(line: str) -> None:
        print(line, flush=True)

    folder = cfg.data_dir.resolve()  # refused before its log file is written into it
    if folder.exists() and any(p.name != LOG_FILE for p in folder.iterdir()):
        typer.echo(f"error: {folder} is not empty: give the soak a fresh folder", err=True)
        raise typer.Exit(2)
    say(f"log: {log_to_file(folder / LOG_FILE)}")
    as_json: Callable[[Any], str] = main_json
    run: Callable[..., Any] = run_soak
    if cfg.replicas > 1:
        from agentrl.bench.soak_replicas import main_json as replicas_json
        from agentrl.bench.soak_replicas import run_replicated_soak

        replicas = cfg.replicas
        run, as_json = run_replicated_soak, lambda r: replicas_json(r, replicas)
    try:
        result = asyncio.run(run(cfg, say))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except (asyncio.CancelledError, KeyboardInterrupt) as exc:
        typer.echo("soak stopped before the end (its services are stopped)", err=True)
        raise typer.Exit(130) from exc
    print(table(result), flush=True)
    sys.stdout.write(as_json(result) + "\n")
    sys.stdout.flush()
    if not result.ok:
        raise typer.Exit(1)
