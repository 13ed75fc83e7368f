"""`agentrl stats ...` and `agentrl warehouse ...`.

`stats` reads the warehouse directly when this process may (a ClickHouse server, or the
embedded chdb when no other process owns it) and otherwise asks the control API of the
running `agentrl up` (`--api`, default http://<api_host>:<api_port>). The options are
drawn from the models of `agentrl.warehouse.options` (`agentrl.core.configcli`); heavy imports
stay inside the commands.
"""

from __future__ import annotations

import inspect
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import typer

from agentrl.core.configcli import argument, config_command
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.options import ExportOptions, IngesterOptions, StatsQuery

QUERY_HELP = {
    "rewards": "Reward distribution per model version and domain (latest reward version).",
    "success": "Success rate and mean reward over time per model version.",
    "lengths": "Trajectory length histogram (turns per trajectory).",
    "tools": "Slowest tools (p95 duration).",
    "failing-tools": "Most failing tools.",
    "feedback": "Feedback counts per type.",
    "training": "Training jobs timeline (one row per job).",
    "deployments": "Deployments timeline.",
    "models": "Model versions.",
    "counts": "Distinct events stored per table.",
}


def _fetch(name: str, api: str | None, token: str | None, **kw: Any) -> Any:
    """Run query `name` here, or through the control API when asked or when another
    process owns the embedded warehouse."""
    from agentrl.core.settings import get_settings

    settings = get_settings()
    if api is None:
        from agentrl.warehouse.access import analytics
        from agentrl.warehouse.backend import WarehouseLocked
        from agentrl.warehouse.queries import run_named

        try:
            return run_named(analytics(settings), name, **kw)
        except WarehouseLocked:
            api = f"http://{settings.api_host}:{settings.api_port}"
            typer.echo(f"(the embedded warehouse is owned by `agentrl up`: asking {api})", err=True)
    import httpx

    params = {
        k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in kw.items() if v is not None
    }
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(
            f"{api.rstrip('/')}/stats/{name}", params=params, headers=headers, timeout=60
        )
    except httpx.HTTPError as exc:
        raise typer.BadParameter(f"cannot reach the control API at {api}: {exc}") from exc
    if response.status_code != 200:
        raise typer.BadParameter(f"{api} answered {response.status_code}: {response.text}")
    return response.json()


def _show(title: str, result: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, default=str, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    rows = (
        [{"table": k, "rows": v} for k, v in result.items()] if isinstance(result, dict) else result
    )
    console = Console()
    if not console.is_terminal:  # piped: do not squeeze the columns into 80 characters
        console = Console(width=200)
    table = Table(title=title)
    if not rows:
        console.print(f"[dim]{title}: no data[/]")
        return
    columns = list(dict.fromkeys(k for row in rows for k in row))
    for col in columns:
        table.add_column(
            col, justify="right" if isinstance(rows[0].get(col), int | float) else "left"
        )
    for row in rows:
        table.add_row(*(_cell(row.get(col)) for col in columns))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return str(value)


TOKEN = inspect.Parameter(
    "token",
    inspect.Parameter.KEYWORD_ONLY,
    default=typer.Option(None, envvar="AGENTRL_API_TOKEN", help="Bearer token for --api."),
    annotation=str,
)
STATS_FIELDS = ("as_json", "since", "until", "model", "domain", "bucket_s", "limit", "api")


def register(app: typer.Typer) -> None:
    stats = typer.Typer(
        help="Warehouse analytics: rewards per model version, success over time, tools, "
        "feedback, jobs and deployments.",
        no_args_is_help=True,
    )
    app.add_typer(stats, name="stats")
    for name, help_ in QUERY_HELP.items():
        run = _query(name)
        run.__doc__ = help_
        stats.command(name)(
            config_command(StatsQuery, STATS_FIELDS, run, [TOKEN], {"as_json": ["--json"]})
        )
    stats.command("ingester")(config_command(StatsQuery, ("api",), _ingester, [TOKEN]))

    wh = typer.Typer(
        help="The ClickHouse warehouse: schema, ingester, dataset export.", no_args_is_help=True
    )
    app.add_typer(wh, name="warehouse")
    where = ("clickhouse_url", "database", "path")
    wh.command("migrate")(config_command(WarehouseSettings, where, _migrate))
    ingester = ("nats_url", *where, "batch_size", "durable_prefix", "migrate")
    wh.command("serve")(config_command(IngesterOptions, ingester, _serve))
    out = argument("out", "Output file: .parquet or .jsonl", Path)
    export = [f for f in ExportOptions.model_fields]
    flags = {"include_raw": ["--no-raw"]}
    wh.command("export")(config_command(ExportOptions, export, _export, [out, TOKEN], flags))


def _query(name: str) -> Any:
    def run(q: StatsQuery, *, token: str | None) -> None:
        _show(QUERY_HELP[name], _fetch(name, q.api, token, **q.params(name)), q.as_json)

    return run


def _ingester(q: StatsQuery, *, token: str | None) -> None:
    """The running ingester's status (through the control API of `agentrl up`)."""
    from agentrl.core.settings import get_settings

    settings = get_settings()
    api = q.api or f"http://{settings.api_host}:{settings.api_port}"
    _show("ingester", _fetch("ingester", api, token), True)


def _migrate(ws: WarehouseSettings) -> None:
    """Apply the schema migrations (idempotent); refuses a schema newer than this code."""
    from agentrl.core.settings import get_settings
    from agentrl.warehouse import schema
    from agentrl.warehouse.backend import open_backend

    backend = open_backend(ws, Path(get_settings().data_dir))
    did = schema.apply(backend, ws)
    for line in did or ["schema is up to date"]:
        typer.echo(line)
    version = schema.current_version(backend, ws)
    typer.echo(f"{ws.backend_name} database {ws.database} at version {version}")


def _serve(cfg: IngesterOptions) -> None:
    """Run the ingester alone (`agentrl up` runs it for you). Ctrl-C stops it; a restart
    resumes from the durable consumers.

    On its own host it needs NATS_URL (a cluster: also AGENTRL_STREAM_REPLICAS=3) and a
    warehouse: AGENTRL_CLICKHOUSE_URL (with AGENTRL_CLICKHOUSE_USER, _PASSWORD,
    _DATABASE) of a ClickHouse server. It opens no port.

    N copies may run (any hosts, same settings): with the same
    AGENTRL_WAREHOUSE_DURABLE_PREFIX they share the durable consumers, each batch goes
    to one of them, and a batch a dead copy inserted but never acked is redelivered to
    another, whose second insert the tables' ReplacingMergeTree keys collapse (counts
    stay exact). Every copy applies the migrations on start (idempotent: CREATE ... IF
    NOT EXISTS); or set AGENTRL_WAREHOUSE_MIGRATE=false and run `agentrl warehouse
    migrate` once as a deploy step. Embedded chdb (no AGENTRL_CLICKHOUSE_URL) is one
    process per data path: one copy only."""
    import asyncio
    import signal

    from agentrl.bus import Bus
    from agentrl.core.settings import get_settings
    from agentrl.warehouse.service import IngesterService

    async def main() -> None:
        bus = await Bus.connect(cfg.nats_url, name="agentrl-warehouse")
        await bus.ensure_streams()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        service = IngesterService(bus, get_settings(), cfg)
        typer.echo("warehouse ingester up; Ctrl-C stops it", err=True)
        try:
            await service.run(stop)
        finally:
            await bus.close()
        typer.echo(json.dumps(service.status.as_dict(), default=str), err=True)

    asyncio.run(main())


def _export(cfg: ExportOptions, *, out: Path, token: str | None) -> None:
    """Export trajectories with their latest reward, filtered like a training request."""
    import time

    dataset_filter = cfg.dataset_filter()
    fmt = "jsonl" if out.suffix in (".jsonl", ".json") else "parquet"
    t0 = time.perf_counter()
    if cfg.api is not None:
        import httpx

        body = {
            "filter": dataset_filter.model_dump(mode="json", exclude_none=True),
            "sample_size": cfg.sample_size,
            "seed": cfg.seed,
            "format": fmt,
            "include_raw": cfg.include_raw,
        }
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = httpx.post(
            f"{cfg.api.rstrip('/')}/stats/export", json=body, headers=headers, timeout=300
        )
        if response.status_code != 200:
            raise typer.BadParameter(f"{cfg.api} answered {response.status_code}: {response.text}")
        out.write_bytes(response.content)
        n = int(response.headers.get("x-agentrl-rows", "0"))
    else:
        from agentrl.core.settings import get_settings
        from agentrl.warehouse.access import open_migrated
        from agentrl.warehouse.export import export

        ws = WarehouseSettings()
        backend = open_migrated(get_settings(), ws)
        n = export(
            backend,
            ws.database,
            out,
            dataset_filter,
            cfg.sample_size,
            seed=cfg.seed,
            include_raw=cfg.include_raw,
        )
    typer.echo(f"wrote {n:,} trajectories to {out} in {time.perf_counter() - t0:.2f}s")
