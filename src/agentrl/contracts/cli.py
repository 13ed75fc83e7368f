"""`agentrl schemas export DIR`: one JSON Schema file per subject."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    schemas = typer.Typer(help="Event contracts as JSON Schema.", no_args_is_help=True)
    app.add_typer(schemas, name="schemas")
    schemas.command("export")(export)


def export(
    out_dir: Path = typer.Argument(..., help="Directory to write <subject>.json into."),
) -> None:
    """Write one JSON Schema file per subject (e.g. agent.rl.trajectory.v1.json)."""
    from agentrl.contracts.schemas import export_schemas

    for path in export_schemas(out_dir):
        typer.echo(str(path))
