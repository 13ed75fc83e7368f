"""`agentrl observability generate` (dashboards, provisioning, alert rules); its options are
`GenerateOptions`' fields (`agentrl.core.configcli`). Heavy imports stay inside."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import BaseModel, ConfigDict

from agentrl.core.configcli import config_command


class GenerateOptions(BaseModel):
    """`agentrl observability generate`: where the files go, or only check them."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    out: Path = Path("ops")
    """Where to write grafana/ and prometheus/."""
    check: bool = False
    """Only check that the files in OUT are current."""


def register(app: typer.Typer) -> None:
    obs = typer.Typer(
        help="Observability: Grafana dashboards and Prometheus alert rules (generated files).",
        no_args_is_help=True,
    )
    app.add_typer(obs, name="observability")
    obs.command("generate")(config_command(GenerateOptions, ("out", "check"), generate))


def generate(cfg: GenerateOptions) -> None:
    """Write the five dashboards, Grafana provisioning files and Prometheus rules (+ tests).

    With --check, write nothing: exit status 1 naming the files in OUT that are stale.

    \b
    Check that the committed files are current (the test suite does):
      agentrl observability generate --check
    """
    from agentrl.observability import generate as files

    if cfg.check:
        stale = files.stale(cfg.out)
        if stale:
            typer.echo(f"stale generated files in {cfg.out}: {', '.join(stale)}", err=True)
            raise typer.Exit(1)
        typer.echo(f"{cfg.out}: generated files are current")
        return
    for path in files.write(cfg.out):
        typer.echo(f"wrote {path}")
