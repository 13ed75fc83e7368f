"""`agentrl bench capture` (heavy imports stay inside the command)."""

from __future__ import annotations

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("capture")
    def bench_capture(
        sessions: int = typer.Option(1000, min=1, help="Concurrent sessions (episodes)."),
        turns: int = typer.Option(5, min=1, help="Requests per session (the last is text)."),
        connections: int = typer.Option(64, min=1, help="HTTP connections of the clients."),
        otlp_traces: int = typer.Option(2000, min=100, help="GenAI traces posted as OTLP."),
    ) -> None:
        """Episodes at the gateway under load (published = sent, tracking cost per request)
        and the OTLP receiver's spans per second."""
        from agentrl.capture.bench import main

        out = main(sessions, turns, connections, otlp_traces)
        if out["lost"] or out["failed_requests"]:
            raise typer.Exit(1)
