"""`agentrl stats ...`, `agentrl warehouse ...` and `agentrl bench warehouse`.

`stats` reads the warehouse directly when this process may (a ClickHouse server, or the
embedded chdb when no other process owns it) and otherwise asks the control API of the
running `agentrl up` (`--api`, default http://<api_host>:<api_port>). Heavy imports stay
inside the commands.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import typer

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
    from agentrl.settings import get_settings

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


def register(app: typer.Typer, bench: typer.Typer) -> None:
    stats = typer.Typer(
        help="Warehouse analytics: rewards per model version, success over time, tools, feedback, jobs and deployments.",
        no_args_is_help=True,
    )
    app.add_typer(stats, name="stats")

    def add_query(name: str) -> None:
        def command(
            as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
            since: datetime = typer.Option(None, help="From this time (ISO 8601, UTC)."),
            until: datetime = typer.Option(None, help="Until this time (ISO 8601, UTC)."),
            model: str = typer.Option(None, help="Only this model version (success, lengths)."),
            domain: str = typer.Option(None, help="Only this domain (lengths)."),
            bucket_s: int = typer.Option(3600, help="Bucket width in seconds (success)."),
            limit: int = typer.Option(10, help="Rows (tools, failing-tools)."),
            api: str = typer.Option(
                None, help="Control API URL (default: read the warehouse here)."
            ),
            token: str = typer.Option(
                None, envvar="AGENTRL_API_TOKEN", help="Bearer token for --api."
            ),
        ) -> None:
            kw: dict[str, Any] = {"since": since, "until": until}
            if name == "success":
                kw.update(model=model, bucket_s=bucket_s)
            elif name == "lengths":
                kw.update(model=model, domain=domain)
            elif name in ("tools", "failing-tools"):
                kw = {"limit": limit}
            elif name not in ("rewards", "feedback"):
                kw = {}
            _show(QUERY_HELP[name], _fetch(name, api, token, **kw), as_json)

        command.__doc__ = QUERY_HELP[name]
        stats.command(name)(command)

    for name in QUERY_HELP:
        add_query(name)

    @stats.command("ingester")
    def ingester_status(
        api: str = typer.Option(None, help="Control API URL (default http://api_host:api_port)."),
        token: str = typer.Option(None, envvar="AGENTRL_API_TOKEN"),
    ) -> None:
        """The running ingester's status (through the control API of `agentrl up`)."""
        from agentrl.settings import get_settings

        settings = get_settings()
        _show(
            "ingester",
            _fetch("ingester", api or f"http://{settings.api_host}:{settings.api_port}", token),
            True,
        )

    wh = typer.Typer(
        help="The ClickHouse warehouse: schema, ingester, dataset export.", no_args_is_help=True
    )
    app.add_typer(wh, name="warehouse")

    @wh.command("migrate")
    def migrate() -> None:
        """Apply the schema migrations (idempotent); refuses a schema newer than this code."""
        from agentrl.settings import get_settings
        from agentrl.warehouse import schema
        from agentrl.warehouse.backend import open_backend
        from agentrl.warehouse.config import WarehouseSettings

        ws = WarehouseSettings()
        backend = open_backend(ws, Path(get_settings().data_dir))
        did = schema.apply(backend, ws)
        for line in did or ["schema is up to date"]:
            typer.echo(line)
        typer.echo(
            f"{ws.backend_name} database {ws.database} at version {schema.current_version(backend, ws)}"
        )

    @wh.command("serve")
    def serve(
        nats_url: str = typer.Option(None, help="NATS server (default: NATS_URL)."),
    ) -> None:
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
        from agentrl.settings import get_settings
        from agentrl.warehouse.service import IngesterService

        async def main() -> None:
            bus = await Bus.connect(nats_url, name="agentrl-warehouse")
            await bus.ensure_streams()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            service = IngesterService(bus, get_settings())
            typer.echo("warehouse ingester up; Ctrl-C stops it", err=True)
            try:
                await service.run(stop)
            finally:
                await bus.close()
            typer.echo(json.dumps(service.status.as_dict(), default=str), err=True)

        asyncio.run(main())

    @wh.command("export")
    def export_cmd(
        out: Path = typer.Argument(..., help="Output file: .parquet or .jsonl"),
        min_reward: float = typer.Option(None, help="Latest reward >= this."),
        max_length: int = typer.Option(None, help="At most this many turns."),
        start: datetime = typer.Option(None, help="Ended at or after (ISO 8601, UTC)."),
        end: datetime = typer.Option(None, help="Ended at or before (ISO 8601, UTC)."),
        domain: list[str] = typer.Option(None, help="Task domain (repeatable)."),
        exclude_profile: list[str] = typer.Option(
            None, help="Subordinate profile to leave out (repeatable)."
        ),
        sample_size: int = typer.Option(None, help="At most this many (deterministic sample)."),
        seed: int = typer.Option(0, help="Sample seed."),
        no_raw: bool = typer.Option(
            False, "--no-raw", help="Summary columns only, without the trajectory JSON."
        ),
        api: str = typer.Option(None, help="Export through this control API instead."),
        token: str = typer.Option(None, envvar="AGENTRL_API_TOKEN"),
    ) -> None:
        """Export trajectories with their latest reward, filtered like a training request."""
        import time
        from datetime import UTC

        from agentrl.contracts.training import DatasetFilter

        filt: dict[str, Any] = {
            "min_reward": min_reward,
            "max_trajectory_length": max_length,
            "task_domains": domain or [],
            "exclude_subordinate_profiles": exclude_profile or [],
        }
        if start or end:
            filt["date_range"] = {
                "start": (start or datetime(1970, 1, 1)).replace(tzinfo=UTC).isoformat(),
                "end": (end or datetime(2299, 1, 1)).replace(tzinfo=UTC).isoformat(),
            }
        dataset_filter = DatasetFilter.model_validate(
            {k: v for k, v in filt.items() if v is not None}
        )
        fmt = "jsonl" if out.suffix in (".jsonl", ".json") else "parquet"
        t0 = time.perf_counter()
        if api is not None:
            import httpx

            body = {
                "filter": dataset_filter.model_dump(mode="json", exclude_none=True),
                "sample_size": sample_size,
                "seed": seed,
                "format": fmt,
                "include_raw": not no_raw,
            }
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            response = httpx.post(
                f"{api.rstrip('/')}/stats/export", json=body, headers=headers, timeout=300
            )
            if response.status_code != 200:
                raise typer.BadParameter(f"{api} answered {response.status_code}: {response.text}")
            out.write_bytes(response.content)
            n = int(response.headers.get("x-agentrl-rows", "0"))
        else:
            from agentrl.settings import get_settings
            from agentrl.warehouse.access import open_migrated
            from agentrl.warehouse.config import WarehouseSettings
            from agentrl.warehouse.export import export

            ws = WarehouseSettings()
            backend = open_migrated(get_settings(), ws)
            n = export(
                backend,
                ws.database,
                out,
                dataset_filter,
                sample_size,
                seed=seed,
                include_raw=not no_raw,
            )
        typer.echo(f"wrote {n:,} trajectories to {out} in {time.perf_counter() - t0:.2f}s")

    @bench.command("warehouse")
    def bench_warehouse(
        quick: bool = typer.Option(
            False, "--quick", help="5,000 trajectories ingested, 10 query runs."
        ),
        n: int = typer.Option(0, help="Trajectories to ingest (default 20,000; --quick 5,000)."),
        repeat: int = typer.Option(0, help="Runs per query (default 30; --quick 10)."),
    ) -> None:
        """Ingest from JetStream into chdb (>= 20,000 turns/s), analytics queries on
        1,000,000 turns (p50 < 200 ms, p99 < 1 s), export of 100,000 filtered trajectories
        to Parquet (< 2 s). Last line: turns_per_s, query_p50_ms, query_p99_ms, export_s, lost."""
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from agentrl.benchmarks.report import report
        from agentrl.warehouse.bench import run

        n_ingest = n or (5_000 if quick else 20_000)
        runs = repeat or (10 if quick else 30)
        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True
        ) as bar:
            task = bar.add_task("starting", total=None)
            rows, figs = run(
                n_ingest, 200_000, runs, progress=lambda m: bar.update(task, description=m)
            )
        ingest = figs["ingest"]
        rows = [
            {
                "query": "ingest (JetStream -> chdb)",
                "turns": ingest["stored_turns"],
                "p50_ms": "",
                "p99_ms": "",
                "max_ms": "",
                "rate": f"{ingest['turns_per_s']:,.0f} turns/s, {ingest['trajectories_per_s']:,.0f} traj/s, rewards {ingest['rewards_per_s']:,.0f}/s",
            },
            {
                "query": "ingest CPU per trajectory (us)",
                "turns": "",
                "p50_ms": "",
                "p99_ms": "",
                "max_ms": "",
                "rate": f"contract validation {ingest['validate_us']:,.0f}, rows {ingest['convert_us']:,.0f}, arrow + insert {ingest['insert_us']:,.0f}",
            },
            *rows,
            {
                "query": f"export {figs['export_rows']:,} trajectories -> Parquet",
                "turns": "",
                "p50_ms": round(figs["export_s"] * 1000),
                "p99_ms": "",
                "max_ms": round(max(figs["export_s_runs"]) * 1000),
                "rate": f"{figs['export_mb']:.1f} MB; summary columns only {figs['export_summary_only_s']:.2f}s",
            },
        ]
        report(
            "warehouse",
            rows,
            {
                "turns_per_s": round(ingest["turns_per_s"], 1),
                "query_p50_ms": round(
                    max(r["p50_ms"] for r in rows if isinstance(r["p50_ms"], float)), 1
                ),
                "query_p99_ms": round(
                    max(r["p99_ms"] for r in rows if isinstance(r["p99_ms"], float)), 1
                ),
                "export_s": round(figs["export_s"], 3),
                "lost": ingest["lost"],
            },
        )
