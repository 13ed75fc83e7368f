"""`agentrl rewards ...` and `agentrl bench rewards` (heavy imports stay inside the commands)."""

from __future__ import annotations

import os
from pathlib import Path

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    rewards = typer.Typer(
        help=(
            "The reward pipeline: score trajectories (task completion, efficiency, code quality, "
            "user feedback, plus your @reward_function components), redact PII, and run the "
            "reward service that turns agent.rl.trajectory.v1 into agent.rl.reward.v1."
        ),
        no_args_is_help=True,
    )
    app.add_typer(rewards, name="rewards")

    @rewards.command("serve")
    def serve(
        nats_url: str = typer.Option(
            None, help="NATS server (default: NATS_URL / AGENTRL_NATS_URL)."
        ),
        data_dir: Path = typer.Option(
            None, help="Where the service keeps its state (default: AGENTRL_DATA_DIR)."
        ),
        config: Path = typer.Option(
            None,
            help="Reward config YAML: weights, window, total_reward raw|normalized, custom "
            "functions, opt-outs (default: AGENTRL_REWARDS_CONFIG, else <data dir>/rewards.yaml "
            "when it exists, as `agentrl up`).",
        ),
        durable: str = typer.Option(
            "rewards",
            help="Durable consumer name; services with one name are replicas of one service.",
        ),
        batch: int = typer.Option(256, help="Trajectories fetched and scored per batch."),
        ack_wait: float = typer.Option(
            30.0, help="Seconds before the server redelivers what a crashed service had not acked."
        ),
    ) -> None:
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
        from agentrl.rewards.config import RewardConfig
        from agentrl.rewards.service import RewardService, config_path
        from agentrl.settings import get_settings

        settings = get_settings()
        if data_dir is not None:
            settings = settings.model_copy(update={"data_dir": data_dir})
        cfg = RewardConfig.load(config or config_path(settings))
        # This process is the service. A batch keeps ~256 validated trajectories alive while
        # it allocates, which makes the automatic collector re-scan them again and again
        # (validation costs twice as much). The service collects between batches instead.
        import gc

        gc.freeze()
        gc.disable()

        async def main() -> None:
            bus = await Bus.connect(nats_url, name="agentrl-rewards")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            service = RewardService(
                bus,
                cfg,
                data_dir or get_settings().data_dir,
                durable=durable,
                batch=batch,
                ack_wait=ack_wait,
            )
            typer.echo(f"reward service up ({cfg.calculator_version}); Ctrl-C stops it", err=True)
            try:
                await service.run(stop)
            finally:
                await bus.close()
            typer.echo(f"stopped: {service.stats()}", err=True)

        asyncio.run(main())

    @rewards.command("score")
    def score(
        path: Path = typer.Argument(
            None, help="JSON or JSON-lines file of trajectories ('-' = stdin)."
        ),
        config: Path = typer.Option(None, help="Reward config YAML."),
        demo: int = typer.Option(
            0, help="Score N generated sample trajectories instead of a file."
        ),
    ) -> None:
        """Score trajectories offline (no bus) and print one reward per line as JSON.

        Windows start empty, so the normalised totals of the first trajectories are near 0;
        the raw totals are final. Example: `agentrl rewards score --demo 3`."""
        import asyncio
        import json
        import sys

        from agentrl.rewards.config import RewardConfig
        from agentrl.rewards.pipeline import Failure, score_payloads

        if demo:
            from agentrl.contracts.samples import sample_trajectory

            payloads: list[bytes | dict[str, object]] = [
                sample_trajectory(i, code=i % 2 == 1, pii=i % 3 == 2) for i in range(demo)
            ]
        elif path is None:
            raise typer.BadParameter("give a file (or '-') or --demo N")
        else:
            text = sys.stdin.read() if str(path) == "-" else path.read_text()
            stripped = text.lstrip()
            if stripped.startswith("["):
                payloads = [json.dumps(d).encode() for d in json.loads(text)]
            else:
                payloads = [line.encode() for line in text.splitlines() if line.strip()]
        results, _ = asyncio.run(score_payloads(payloads, RewardConfig.load(config)))
        for res in results:
            if isinstance(res, Failure):
                typer.echo(json.dumps({"error": res.reason}))
            else:
                typer.echo(res.to_json().decode())

    @rewards.command("redact")
    def redact(path: Path = typer.Argument(..., help="A JSON file ('-' = stdin).")) -> None:
        """Print a JSON document with its PII redacted.

        E-mails, API keys and tokens, password assignments, phone and card numbers are
        replaced by [REDACTED:KIND]; stderr says how many of each kind."""
        import json
        import sys

        from agentrl.rewards.redact import redact_payload

        data = json.loads(sys.stdin.read() if str(path) == "-" else path.read_text())
        cleaned, report = redact_payload(data)
        typer.echo(json.dumps(cleaned, indent=2))
        typer.echo(f"redacted: {dict(report.counts)}", err=True)

    @bench.command("redaction")
    def bench_redaction(
        n: int = typer.Option(2000, help="Sample trajectories timed through redact_event."),
    ) -> None:
        """PII redaction: precision and recall on the labelled corpus (agentrl.rewards.pii_corpus,
        207 hand-written strings, about half of them near-misses), and the cost of redacting at the
        edge (`redact_event`, what producers call before publishing) per trajectory in µs."""
        from agentrl.benchmarks.report import report
        from agentrl.rewards.pii_bench import edge_cost, score_corpus

        scores = score_corpus()
        cost = edge_cost(n)
        rows = [
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
        report(
            "redaction",
            rows,
            {
                "precision": round(scores["precision"], 4),
                "recall": round(scores["recall"], 4),
                "corpus_strings": scores["strings"],
                "false_positives": scores["false_positives"],
                "false_negatives": scores["false_negatives"],
                "edge_redaction_us_per_trajectory": round(cost["us_per_trajectory"], 1),
                "edge_redaction_us_median": round(cost["us_per_trajectory_median"], 1),
                "edge_redaction_us_clean": round(cost["us_clean_median"], 1),
                "edge_redaction_us_with_pii": round(cost["us_with_pii_median"], 1),
            },
        )

    @bench.command("rewards")
    def bench_rewards(
        quick: bool = typer.Option(
            False, "--quick", help="10,000 + 1,000 trajectories instead of 50,000 + 5,000."
        ),
        n: int = typer.Option(0, help="Trajectories without code (overrides --quick)."),
        n_code: int = typer.Option(0, help="Trajectories with code (overrides --quick)."),
        url: str = typer.Option(
            None, help="Use an existing NATS server (its trajectory and reward streams are purged)."
        ),
        replicas: int = typer.Option(
            1,
            min=1,
            help="Compare one service with this many replicas on one durable (1, N, N, 1), "
            "instead of the usual phases.",
        ),
    ) -> None:
        """End to end through the running reward service: trajectories in, rewards out.

        Publishes trajectories to the embedded NATS and counts the rewards that come back. Targets on 2 cores: >= 5,000
        trajectories/s without code, >= 200/s with code (ruff + bandit), lost 0, duplicates 0.
        The peer is a raw nats-py service that answers every trajectory with a fixed reward.

        With --replicas N: one service against N replicas sharing the durable, on this
        machine, side by side. On one small machine the replicas share its cores, so the
        ratio shows the cost of coordinating them, not scale-out."""
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from agentrl.benchmarks.report import report
        from agentrl.rewards.bench import run_replicas_benchmark, run_rewards_benchmark

        plain = n or (10_000 if quick else 50_000)
        code = n_code or (1_000 if quick else 5_000)
        if replicas > 1:
            with Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                transient=True,
            ) as bar:
                task = bar.add_task("starting", total=None)
                rows = run_replicas_benchmark(
                    plain,
                    replicas,
                    url,
                    paced_s=2.0 if quick else 4.0,
                    progress=lambda m: bar.update(task, description=m),
                )
            one = [r for r in rows if r["replicas"] == 1]
            many = [r for r in rows if r["replicas"] == replicas]
            one_rate = sum(r["per_s"] for r in one) / len(one)
            many_rate = sum(r["per_s"] for r in many) / len(many)
            cores = os.cpu_count() or 1
            typer.echo(
                f"{replicas} replicas on one {cores}-core machine share its cores: the ratio "
                "is the cost of coordination (claims in NATS KV, shared consumer), it "
                "cannot show scale-out; that needs a host per replica.",
                err=True,
            )
            report(
                "rewards",
                rows,
                {
                    "replicas": replicas,
                    "one_replica_trajectories_per_s": round(one_rate, 1),
                    "replicas_trajectories_per_s": round(many_rate, 1),
                    "ratio": round(many_rate / one_rate, 3) if one_rate else None,
                    "one_replica_service_cpu_us": round(
                        sum(r["service_cpu_us"] for r in one) / len(one), 1
                    ),
                    "replicas_service_cpu_us": round(
                        sum(r["service_cpu_us"] for r in many) / len(many), 1
                    ),
                    "lost": sum(r["lost"] for r in rows),
                    "duplicates": sum(r["duplicates"] for r in rows),
                    "cpu_cores": cores,
                    "shows_scale_out": False,
                    "n": plain,
                    "complete": all(r["complete"] for r in rows),
                },
            )
            return
        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True
        ) as bar:
            task = bar.add_task("starting", total=None)
            rows = run_rewards_benchmark(
                plain,
                code,
                url,
                paced_s=2.0 if quick else 4.0,
                progress=lambda m: bar.update(task, description=m),
            )
        plain_row, off_row, code_row, peer, off_row2, on_row2 = rows
        # metrics cost: service CPU per trajectory with metrics on vs off, ABBA order (wall
        # rates on a shared machine move more than the effect; both are reported)
        on_cpu = (plain_row["service_cpu_us"] + on_row2["service_cpu_us"]) / 2
        off_cpu = (off_row["service_cpu_us"] + off_row2["service_cpu_us"]) / 2
        overhead = max(0.0, on_cpu / off_cpu - 1)
        figures = {
            "trajectories_per_s": round(plain_row["per_s"], 1),
            "code_trajectories_per_s": round(code_row["per_s"], 1),
            "lost": plain_row["lost"] + code_row["lost"],
            "duplicates": plain_row["duplicates"] + code_row["duplicates"],
            "p99_latency_ms": round(plain_row["p99_ms"], 1),
            "p99_latency_paced_rate_per_s": round(plain_row["paced_rate"], 1),
            "code_p99_latency_ms": round(code_row["p99_ms"], 1),
            "p99_latency_saturated_ms": round(plain_row["p99_saturated_ms"], 1),
            "service_cpu_us_per_trajectory": round(plain_row["service_cpu_us"], 1),
            "code_service_cpu_us_per_trajectory": round(code_row["service_cpu_us"], 1),
            "peer_raw_nats_py_echo_per_s": round(peer["per_s"], 1),
            "metrics_on_trajectories_per_s": round((plain_row["per_s"] + on_row2["per_s"]) / 2, 1),
            "metrics_off_trajectories_per_s": round((off_row["per_s"] + off_row2["per_s"]) / 2, 1),
            "metrics_on_service_cpu_us_per_trajectory": round(on_cpu, 1),
            "metrics_off_service_cpu_us_per_trajectory": round(off_cpu, 1),
            "metrics_overhead_fraction": round(overhead, 4),
            "n": plain,
            "n_code": code,
            "complete": all(r["complete"] for r in rows),
        }
        report("rewards", rows, figures)
