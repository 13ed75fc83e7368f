"""The application's commands: `agentrl up` (the stack), `agentrl loop` (the main job: the
whole feedback loop on it) and `agentrl report` (`agentrl soak` and the benchmarks are
`agentrl.bench.cli`'s). Heavy imports live inside the commands, so `agentrl --help` stays
fast."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from agentrl.app.options import ReportOptions, UpOptions


def register(app: typer.Typer) -> None:
    from agentrl.app.loop_config import LoopConfig
    from agentrl.app.options import ReportOptions, UpOptions
    from agentrl.core.configcli import config_command, flag, model_command

    own = [
        flag("quick", "The short profile: tiny model."),
        flag("show_config", "Print the settings as JSON and exit."),
    ]
    app.command("loop")(model_command(LoopConfig, LOOP_OPTIONS, _loop, own))
    app.command("up")(config_command(UpOptions, None, _up))
    app.command("report")(config_command(ReportOptions, None, _report))
    retired = model_command(LoopConfig, ("data_dir",), _demo)
    app.command("demo", hidden=True, deprecated=True)(retired)


def _report(cfg: ReportOptions) -> None:
    """Write an HTML report: held-out success per version (DIR/heldout.json), lineage, plots."""
    from agentrl.app.report import run_report

    page = run_report(cfg.out, source=cfg.source, nats_url=cfg.nats_url, hours=cfg.hours)
    typer.echo(f"report: {page}")


def _demo(overrides: dict[str, object]) -> None:
    """Retired: the first closed loop, superseded by `agentrl loop --quick` (which it runs)."""
    typer.echo(
        "agentrl demo is retired: it runs `agentrl loop --quick` now (the same chain on "
        "the whole stack); use that command.",
        err=True,
    )
    _loop(overrides, quick=True, show_config=False)


# `agentrl loop`'s options: these fields of `LoopConfig` (their docstrings are the help);
# `--set FIELD=VALUE` reaches the others
LOOP_OPTIONS = (
    "env",
    "backend",
    "model",
    "data_dir",
    "generations",
    "until_benchmark",
    "threshold",
    "heldout_seeds",
    "unseen_seeds",
    "time_budget_s",
    "temperature",
    "learning_rate",
    "gamma",
    "init_checkpoint",
    "bad_candidate",
    "pace",
    "structured",
    "hints",
    "partial_credit",
    "replay_steps",
    "lineages",
)


def _loop(overrides: dict[str, object], *, quick: bool, show_config: bool) -> None:
    """The main job: agents act through the stack's gateway, jobs train, canaries decide;
    then held-out success per version, the report, one JSON line. Unset options take the
    profile's value (--env, --backend, --quick choose it)."""

    from pydantic import ValidationError

    from agentrl.app.loop import run_loop, table
    from agentrl.app.loop_config import LoopConfig

    try:
        cfg = LoopConfig.profile(quick=quick, **overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if show_config:
        print(cfg.model_dump_json(indent=2))
        return
    if cfg.backend == "vllm" and cfg.model in ("tiny", "tiny-random"):
        typer.echo(
            "error: the tiny model's head size (16) is not one vLLM's CPU kernels run; "
            "use --backend vllm with smollm2 (not --quick)",
            err=True,
        )
        raise typer.Exit(2)
    if cfg.backend == "vllm" and cfg.temperature > 2.0:
        # vLLM samples a guided_choice token by token and refuses temperature > 2 (the
        # local backend scores the choices, where 6 is near-uniform exploration); every
        # vLLM profile explores at 2 or less, so only --temperature gets here
        typer.echo("error: vLLM takes temperature <= 2 (--temperature)", err=True)
        raise typer.Exit(2)

    def say(line: str) -> None:
        print(line, flush=True)

    if cfg.lineages:  # `--lineages N`: the table per lineage, then one JSON line
        from agentrl.app import loop_lineages

        if cfg.env != "frozenlake" or cfg.backend != "local":
            typer.echo("error: --lineages runs the FrozenLake loop on the local backend", err=True)
            raise typer.Exit(2)
        run = loop_lineages.run_lineages(
            cfg, cfg.lineages, say, drill=cfg.bad_candidate, log_file="loop.log"
        )
        _finish(run, loop_lineages.table)
        return
    _finish(run_loop(cfg, say, log_file="loop.log"), table)


def _finish(run: Any, table: Any) -> None:
    """Run a loop to its end; its table, its report's path, then one JSON line."""
    import asyncio

    try:
        result = asyncio.run(run)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except (asyncio.CancelledError, KeyboardInterrupt) as exc:
        typer.echo("stopped before the end: no table", err=True)
        raise typer.Exit(130) from exc
    print(table(result), flush=True)
    if result.report:
        print(f"report: {result.report}", flush=True)
    sys.stdout.write(json.dumps(result.summary()) + "\n")
    sys.stdout.flush()


def _up(cfg: UpOptions) -> None:
    """Start the whole embedded stack: nats-server with JetStream and all streams,
    the reward service, the warehouse ingester, the training service with its
    triggers, the deployment controller with the OpenAI-compatible gateway, and
    the control API with /metrics and /health; each service supervised
    (restarted with backoff). It prints every URL it serves and shows a live
    status panel. Ctrl-C stops everything cleanly.

    \b
    Ports: AGENTRL_API_PORT (8600), AGENTRL_GATEWAY_PORT (8700), loopback.
    --data-dir keeps several stacks apart (give each its own ports).

    \b
    "agentrl is up" is printed once the gateway serves; until then it says
    what it waits for (the first start converts the bundled model: minutes).
    The converted model is cached once for every data dir in
    ~/.cache/agentrl/models ($XDG_CACHE_HOME; AGENTRL_MODELS_DIR moves it).

    \b
    An OpenAI client: one model name, split across the versions; the
    response's `model` names the version that answered.
      from openai import OpenAI
      client = OpenAI(base_url="http://127.0.0.1:8700/v1", api_key="x")
      client.chat.completions.create(
          model="agentrl-policy", messages=[...])
    AGENTRL_DEPLOY_API_KEYS='["k"]' requires keys; the header x-session-id
    keeps a session on one version; extra_body={"guided_choice": [...]}
    answers with one of the choices.

    \b
    Capture: requests with a session key (header x-agentrl-session) form
    one episode until POST /v1/episodes/{key}/end or 300 s idle
    (AGENTRL_CAPTURE_IDLE_TIMEOUT_S). A request waits at most
    AGENTRL_DEPLOY_BACKEND_TIMEOUT_S (300) for its answer, then gets a
    504 (logged; the episode keeps it as a failed turn): raise it when a
    big model on a CPU answers slower.

    \b
    Agent Zero: `agentrl agent-zero install PATH_TO_AGENT_ZERO` copies the
    plugin and prints the chat model settings: provider OpenAI-compatible
    ("other"), model "agentrl-policy", API base http://127.0.0.1:8700/v1.
    Its trajectories then flow to NATS_URL (printed below) and train the
    next version.
    """
    import os

    # the console is the status panel's: no weight-loading progress bars (the main
    # job's console has none either); a user's own setting wins
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if cfg.gateway_workers is not None:  # read by the deploy service, replicas' too
        os.environ["AGENTRL_DEPLOY_GATEWAY_WORKERS"] = str(cfg.gateway_workers)
    _check_gateway_workers()
    if cfg.gateway_front is not None:
        os.environ["AGENTRL_DEPLOY_GATEWAY_FRONT"] = cfg.gateway_front
    _check_gateway_front()
    from agentrl.app.stack import run_stack
    from agentrl.observability.multiproc import enable_for_stack

    data_dir = None if cfg.data_dir is None else str(cfg.data_dir)
    enable_for_stack(data_dir)  # job child processes report to the one /metrics
    if cfg.cluster is not None:
        _up_cluster(cfg.cluster, data_dir, cfg.services, cfg.replicas)
        return
    run_stack(data_dir=data_dir, port=cfg.port, services=cfg.services, replicas=cfg.replicas)


def _check_gateway_workers() -> None:
    """Refuse, before anything starts, gateway workers this deployment cannot serve right
    (the deploy service would fail with the same reason, restarted without end)."""
    from agentrl.capture.settings import CaptureSettings
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.gateway_workers import WorkersRefused, check

    deploy = DeploySettings()
    try:
        check(deploy.gateway_workers, deploy.backend, CaptureSettings().enabled)
    except WorkersRefused as exc:
        typer.echo(f"error: --gateway-workers {deploy.gateway_workers}: {exc}", err=True)
        raise typer.Exit(2) from None


def _check_gateway_front() -> None:
    """Refuse, before anything starts, a front this deployment cannot run (not built, the
    local backend, capture on): the deploy service would fail on it, restarted without end."""
    from pydantic import ValidationError

    from agentrl.capture.settings import CaptureSettings
    from agentrl.serving import front
    from agentrl.serving.config import DeploySettings

    try:
        deploy = DeploySettings()
        if deploy.gateway_front == "rust":
            front.check(deploy, CaptureSettings().enabled)
    except (ValueError, ValidationError) as exc:
        typer.echo(f"error: --gateway-front: {exc}", err=True)
        raise typer.Exit(2) from None


def _up_cluster(size: int, data_dir: str | None, services: bool, replicas: int = 1) -> None:
    """`agentrl up --cluster N`: N local nats-servers, NATS_URL pointing at all of them and
    AGENTRL_STREAM_REPLICAS=min(3, N), then the usual stack against them."""
    import os
    from pathlib import Path

    from agentrl.app.stack import run_stack
    from agentrl.bus.server import NatsCluster
    from agentrl.core.settings import get_settings

    base = Path(data_dir) if data_dir else get_settings().data_dir
    with NatsCluster(base / "cluster", size=size) as nodes:
        os.environ["NATS_URL"] = nodes.url
        os.environ["AGENTRL_STREAM_REPLICAS"] = str(min(3, size))
        get_settings.cache_clear()
        print(f"nats cluster of {size} servers, JetStream store under {base / 'cluster'}")
        for node in nodes.nodes:
            print(f"  {node.server_name} listening on {node.url}  log: {node.log_file}")
        run_stack(data_dir=data_dir, services=services, replicas=replicas)
