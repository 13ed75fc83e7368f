"""`agentrl soak`: the whole loop with its services killed and restarted (heavy imports inside)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @app.command("soak")
    def soak_cmd(
        data_dir: Path = typer.Option(
            Path(".agentrl/soak"), help="A fresh (empty or missing) folder for this soak's stack."
        ),
        agents: int = typer.Option(2, help="Agent workers acting through the gateway."),
        threshold: int = typer.Option(16, help="Rewarded trajectories per training job."),
        restart_delay_s: float = typer.Option(
            1.0, help="Seconds between a kill and the restart (a supervisor's backoff)."
        ),
        recover_timeout_s: float = typer.Option(
            120.0, help="A component not back after this long counts as not recovered."
        ),
        replicas: int = typer.Option(
            1,
            min=1,
            help="Run this many of every service (each replica its own processes) and kill "
            "one of each kind during the run (the replicated soak).",
        ),
        cluster: int = typer.Option(
            0,
            help="With --replicas: a NATS cluster of this many nodes (3); its stream "
            "leader is killed during the run.",
        ),
        quick: bool = typer.Option(
            False, "--quick", help="With --replicas: shorter waits and a smaller threshold."
        ),
    ) -> None:
        """Run the loop on a stack whose services are separate processes (tiny model, loopback
        only) and kill, once each, the reward service, the warehouse ingester, a running
        training job's process and nats-server (SIGKILL), restarting each. Then check that
        every trajectory has exactly one reward per version, the warehouse matches the
        streams, no job is stuck and every gateway error was counted. Prints the recovery
        times and checks; the last line is one JSON object; exit code 1 if a check failed."""
        import asyncio

        from agentrl.soak import SoakConfig, main_json, run_soak, table

        cfg = SoakConfig(
            data_dir=data_dir,
            agents=agents,
            threshold=threshold,
            restart_delay_s=restart_delay_s,
            recover_timeout_s=recover_timeout_s,
            replicas=replicas,
            cluster=cluster,
        )

        def say(line: str) -> None:
            print(line, flush=True)

        if replicas > 1:
            from agentrl.soak_replicas import main_json as replicas_json
            from agentrl.soak_replicas import run_replicated_soak

            if quick:
                cfg.agents, cfg.threshold, cfg.settle_s = 1, min(threshold, 8), 3.0
                cfg.job_wait_s, cfg.drain_timeout_s = 180.0, 120.0
            run, as_json = run_replicated_soak, lambda r: replicas_json(r, replicas)
        else:
            run, as_json = run_soak, main_json
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
