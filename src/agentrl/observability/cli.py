"""`agentrl observability generate` (dashboards, provisioning, alert rules). Heavy imports stay
inside."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    obs = typer.Typer(
        help="Observability: Grafana dashboards and Prometheus alert rules (generated files).",
        no_args_is_help=True,
    )
    app.add_typer(obs, name="observability")

    @obs.command("generate")
    def generate_cmd(
        out: Path = typer.Option(Path("ops"), help="Where to write grafana/ and prometheus/."),
        check: bool = typer.Option(False, help="Only check that the files in OUT are current."),
    ) -> None:
        """Write the five dashboards, Grafana provisioning files and Prometheus rules (+ tests)."""
        from agentrl.observability import generate

        if check:
            stale = generate.stale(out)
            if stale:
                typer.echo(f"stale generated files in {out}: {', '.join(stale)}", err=True)
                raise typer.Exit(1)
            typer.echo(f"{out}: generated files are current")
            return
        for path in generate.write(out):
            typer.echo(f"wrote {path}")
