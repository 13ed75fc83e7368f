"""`agentrl rewards ...` (`agentrl bench rewards|redaction` are `agentrl.bench.cli`'s). The options are drawn from
the models of `agentrl.rewards.options` (`agentrl.core.configcli`); heavy imports stay inside
the commands."""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path

import typer

from agentrl.core.configcli import argument, config_command
from agentrl.rewards.options import ScoreOptions, ServeOptions

HELP = (
    "The reward pipeline: score trajectories (task completion, efficiency, code quality, "
    "user feedback, plus your @reward_function components), redact PII, and run the "
    "reward service that turns agent.rl.trajectory.v1 into agent.rl.reward.v1."
)


def register(app: typer.Typer) -> None:
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
    import signal

    from agentrl.bus import Bus
    from agentrl.core.settings import get_settings
    from agentrl.rewards.config import RewardConfig
    from agentrl.rewards.service import RewardService, collector_off, config_path

    settings = get_settings()
    if cfg.data_dir is not None:
        settings = settings.model_copy(update={"data_dir": cfg.data_dir})
    rewards = RewardConfig.load(cfg.config or config_path(settings))
    collector_off()  # this process is the service: it collects between batches

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
