"""`agentrl rewards ...` and `agentrl bench rewards|redaction`. The options are drawn from
the models of `agentrl.rewards.options` (`agentrl.core.configcli`); heavy imports stay inside
the commands."""

from __future__ import annotations

import json
import os
import sys
import typing
from pathlib import Path
from typing import Any

import typer

from agentrl.core.configcli import argument, config_command
from agentrl.rewards.options import RedactionBench, RewardsBench, ScoreOptions, ServeOptions

HELP = (
    "The reward pipeline: score trajectories (task completion, efficiency, code quality, "
    "user feedback, plus your @reward_function components), redact PII, and run the "
    "reward service that turns agent.rl.trajectory.v1 into agent.rl.reward.v1."
)


def register(app: typer.Typer, bench: typer.Typer) -> None:
    rewards = typer.Typer(help=HELP, no_args_is_help=True)
    app.add_typer(rewards, name="rewards")
    serve = ("nats_url", "data_dir", "config", "durable", "batch", "ack_wait")
    rewards.command("serve")(config_command(ServeOptions, serve, _serve))
    path = argument(
        "path",
        "JSON or JSON-lines file of trajectories ('-' = stdin).",
        typing.Optional[Path],  # noqa: UP045 - a runtime type
        None,
    )
    rewards.command("score")(config_command(ScoreOptions, ("config", "demo"), _score, [path]))
    rewards.command("redact")(_redact)
    bench.command("redaction")(config_command(RedactionBench, ("n",), _bench_redaction))
    fields = ("n", "n_code", "url", "replicas")
    bench.command("rewards")(config_command(RewardsBench, fields, _bench_rewards))


def _serve(cfg: ServeOptions) -> None:
    """Run the reward service (trajectories and feedback in, rewards out).

    Consumes agent.rl.trajectory.v1 and agent.rl.feedback.v1 and publishes
    agent.rl.reward.v1. Stops cleanly on Ctrl-C / SIGTERM; restarting continues with the
    same normalisation windows (kept in the data dir). `agentrl up` runs it for you.

    On its own host it needs NATS_URL (a cluster: also AGENTRL_STREAM_REPLICAS=3), the
    same reward config as every other copy, and a local data dir (AGENTRL_DATA_DIR or
    --data-dir) for its cache: normalisation windows, counters, an outbox. No shared
    storage, no port.

    N copies may run (any hosts, or several on one host, even on one data dir) with the
    same --durable: they share the trajectory and feedback consumers, and exactly one
    reward per (trajectory, version) comes from the shared records in the NATS KV bucket
    rl_rewards_<durable> (create-only keys, compare-and-set), not from a local file. A
    trajectory is acked only once its reward is in the stream, so a copy killed at any
    point loses and duplicates nothing. AGENTRL_REPLICA_ID names a copy in those
    records (default host-pid). Each copy normalises with the windows of what it scored
    itself."""
    import asyncio
    import gc
    import signal

    from agentrl.bus import Bus
    from agentrl.core.settings import get_settings
    from agentrl.rewards.config import RewardConfig
    from agentrl.rewards.service import RewardService, config_path

    settings = get_settings()
    if cfg.data_dir is not None:
        settings = settings.model_copy(update={"data_dir": cfg.data_dir})
    rewards = RewardConfig.load(cfg.config or config_path(settings))
    # This process is the service. A batch keeps ~256 validated trajectories alive while
    # it allocates, which makes the automatic collector re-scan them again and again
    # (validation costs twice as much). The service collects between batches instead.
    gc.freeze()
    gc.disable()

    async def main() -> None:
        bus = await Bus.connect(cfg.nats_url, name="agentrl-rewards")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        service = RewardService(
            bus,
            rewards,
            settings.data_dir,
            **cfg.model_dump(
                include={"durable", "batch", "ack_wait", "max_deliver", "max_inflight"}
            ),
        )
        typer.echo(f"reward service up ({rewards.calculator_version}); Ctrl-C stops it", err=True)
        try:
            await service.run(stop)
        finally:
            await bus.close()
        typer.echo(f"stopped: {service.stats()}", err=True)

    asyncio.run(main())


def _score(cfg: ScoreOptions, *, path: Path | None) -> None:
    """Score trajectories offline (no bus) and print one reward per line as JSON.

    Windows start empty, so the normalised totals of the first trajectories are near 0;
    the raw totals are final. Example: `agentrl rewards score --demo 3`."""
    import asyncio

    from agentrl.rewards.config import RewardConfig
    from agentrl.rewards.pipeline import Failure, score_payloads

    payloads: list[bytes | dict[str, object]]
    if cfg.demo:
        from agentrl.contracts.samples import sample_trajectory

        payloads = [sample_trajectory(i, code=i % 2 == 1, pii=i % 3 == 2) for i in range(cfg.demo)]
    elif path is None:
        raise typer.BadParameter("give a file (or '-') or --demo N")
    else:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
        if text.lstrip().startswith("["):
            payloads = [json.dumps(d).encode() for d in json.loads(text)]
        else:
            payloads = [line.encode() for line in text.splitlines() if line.strip()]
    results, _ = asyncio.run(score_payloads(payloads, RewardConfig.load(cfg.config)))
    for res in results:
        if isinstance(res, Failure):
            typer.echo(json.dumps({"error": res.reason}))
        else:
            typer.echo(res.to_json().decode())


def _redact(path: Path = typer.Argument(..., help="A JSON file ('-' = stdin).")) -> None:
    """Print a JSON document with its PII redacted.

    E-mails, API keys and tokens, password assignments, phone and card numbers are
    replaced by [REDACTED:KIND]; stderr says how many of each kind."""
    from agentrl.rewards.redact import redact_payload

    data = json.loads(sys.stdin.read() if str(path) == "-" else path.read_text())
    cleaned, report = redact_payload(data)
    typer.echo(json.dumps(cleaned, indent=2))
    typer.echo(f"redacted: {dict(report.counts)}", err=True)


def _bench_redaction(cfg: RedactionBench) -> None:
    """PII redaction: precision and recall on the labelled corpus (agentrl.rewards.pii_corpus,
    207 hand-written strings, about half of them near-misses), and the cost of redacting at the
    edge (`redact_event`, what producers call before publishing) per trajectory in µs."""
    from agentrl.benchmarks.report import report
    from agentrl.rewards.pii_bench import edge_cost, score_corpus

    scores = score_corpus()
    cost = edge_cost(cfg.n)
    rows: list[dict[str, Any]] = [
        {"kind": kind, "positives": v["positives"], "recall": round(v["recall"], 3)}
        for kind, v in scores["per_kind"].items()
    ]
    rows.append(
        {
            "kind": "all",
            "positives": scores["positives"],
            "recall": round(scores["recall"], 3),
            "precision": round(scores["precision"], 3),
            "false_positives": scores["false_positives"],
        }
    )
    for miss in scores["misses"]:
        typer.echo(f"missed: {miss!r}", err=True)
    for alarm in scores["false_alarms"]:
        typer.echo(f"false alarm: {alarm!r}", err=True)
    figures = {
        "precision": round(scores["precision"], 4),
        "recall": round(scores["recall"], 4),
        "corpus_strings": scores["strings"],
        "false_positives": scores["false_positives"],
        "false_negatives": scores["false_negatives"],
        "edge_redaction_us_per_trajectory": round(cost["us_per_trajectory"], 1),
        "edge_redaction_us_median": round(cost["us_per_trajectory_median"], 1),
        "edge_redaction_us_clean": round(cost["us_clean_median"], 1),
        "edge_redaction_us_with_pii": round(cost["us_with_pii_median"], 1),
    }
    report("redaction", rows, figures)


def _bench_rewards(cfg: RewardsBench) -> None:
    """End to end through the running reward service: trajectories in, rewards out.

    Publishes trajectories to the embedded NATS and counts the rewards that come back.
    Targets on 2 cores: >= 5,000 trajectories/s without code, >= 200/s with code (ruff +
    bandit), lost 0, duplicates 0. The peer is a raw nats-py service that answers every
    trajectory with a fixed reward.

    With --replicas N: one service against N replicas sharing the durable, on this
    machine, side by side. On one small machine the replicas share its cores, so the
    ratio shows the cost of coordinating them, not scale-out."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from agentrl.benchmarks.report import report
    from agentrl.rewards import bench

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(message: str) -> None:
            bar.update(task, description=message)

        if cfg.replicas > 1:
            rows = bench.run_replicas_benchmark(
                cfg.n, cfg.replicas, cfg.url, paced_s=cfg.paced_s, progress=progress
            )
        else:
            rows = bench.run_rewards_benchmark(
                cfg.n, cfg.n_code, cfg.url, paced_s=cfg.paced_s, progress=progress
            )
    if cfg.replicas > 1:
        typer.echo(
            f"{cfg.replicas} replicas on one {os.cpu_count() or 1}-core machine share its "
            "cores: the ratio is the cost of coordination (claims in NATS KV, shared "
            "consumer), it cannot show scale-out; that needs a host per replica.",
            err=True,
        )
        report("rewards", rows, bench.replica_figures(rows, cfg.replicas, cfg.n))
    else:
        report("rewards", rows, bench.phase_figures(rows, cfg.n, cfg.n_code))
