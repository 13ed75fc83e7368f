"""`agentrl bench warehouse`: ingest, analytics queries and export on embedded chdb.

1. Ingest: N trajectories of 5 turns (4 tool calls and a response, ~1.5 KB of JSON each)
   are published to a fresh embedded nats-server first; then the ingester service starts in
   this process and the clock runs until every trajectory is stored and acked (drain rate of
   a backlog: the ingester's own throughput, publishing excluded). `lost` = published minus
   stored (distinct, FINAL). A second stream of one reward per trajectory is drained the
   same way and reported beside it.
2. Queries: a synthetic warehouse of 200,000 trajectories / ~1,000,000 turns (plus a reward
   per trajectory, 10 % with a second version, feedback, training events, deployments) is
   generated inside chdb with INSERT ... SELECT; each analytics query runs `repeat` times;
   the JSON reports the worst query's p50 and p99.
3. Export: the trajectories with reward >= 0.5 (100,000 of them) with their stored JSON to
   Parquet (zstd), timed end to end (query + file).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.bus import Bus, EmbeddedNats
from agentrl.contracts.training import DatasetFilter
from agentrl.core.settings import Settings
from agentrl.warehouse import samples as S
from agentrl.warehouse import schema
from agentrl.warehouse.backend import Backend, open_backend
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.options import WarehouseBench
from agentrl.warehouse.queries import Analytics
from agentrl.warehouse.service import IngesterService

TOOLS = (
    ("search", True, 12.0),
    ("code_exe", True, 80.0),
    ("memory", True, 3.0),
    ("code_exe", False, 95.0),
)


def _events(n: int, offset: int) -> tuple[list[Any], list[Any]]:
    trajs = [
        S.trajectory(offset + i, tools=TOOLS, domain=("coding", "research")[i % 2])
        for i in range(n)
    ]
    rewards = [S.reward(offset + i, (i % 100) / 100) for i in range(n)]
    return trajs, rewards


async def _pending(bus: Bus, stream: str, durable: str) -> int:
    try:
        info = await bus.js.consumer_info(stream, durable)
    except Exception:
        return int((await bus.js.stream_info(stream)).state.messages)
    return int(info.num_pending + info.num_ack_pending)


async def _drain(
    bus: Bus, settings: Settings, ws: WarehouseSettings, stream: str, kind: str
) -> float:
    """Start the ingester, wait until `stream` is fully acked, stop; returns seconds."""
    stop = asyncio.Event()
    service = IngesterService(bus, settings, ws)
    t0 = time.perf_counter()
    task = asyncio.create_task(service.run(stop))
    durable = f"{ws.durable_prefix}-{kind}"
    await asyncio.sleep(0.05)
    while await _pending(bus, stream, durable) > 0:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - t0
    stop.set()
    await asyncio.wait_for(task, 60)
    return elapsed


async def _ingest(n: int, data: Path, progress: Callable[[str], None]) -> dict[str, Any]:
    with EmbeddedNats(data_dir=data / "nats") as srv:
        bus = await Bus.connect(srv.url)
        await bus.ensure_streams()
        progress(f"building {n:,} trajectories and rewards")
        trajs, rewards = _events(n, 10_000_000)
        settings = Settings(data_dir=data)
        ws = WarehouseSettings(path=data / "chdb", database="bench_ingest")
        progress("publishing trajectories")
        for k in range(0, n, 2000):
            await bus.publish_many(trajs[k : k + 2000])
        progress("ingesting trajectories")
        t_traj = await _drain(bus, settings, ws, "RL_TRAJECTORIES", "trajectory")
        progress("publishing rewards")
        for k in range(0, n, 2000):
            await bus.publish_many(rewards[k : k + 2000])
        progress("ingesting rewards")
        t_rew = await _drain(bus, settings, ws, "RL_REWARDS", "reward")
        backend = open_backend(ws, data)
        counts = Analytics(backend, ws.database).counts()
        cost = _cost_breakdown(trajs[:2000], backend)
        dead = int((await bus.js.stream_info("RL_DLQ")).state.messages)
        await bus.close()
    turns = counts["turns"]
    return {
        "trajectories": n,
        "stored_trajectories": counts["trajectories"],
        "stored_turns": turns,
        "ingest_s": t_traj,
        "turns_per_s": turns / t_traj,
        "trajectories_per_s": counts["trajectories"] / t_traj,
        "rewards_per_s": counts["rewards"] / t_rew,
        "lost": (n - counts["trajectories"]) + (n - counts["rewards"]),
        **cost,
        "dead_lettered": dead,
    }


def _cost_breakdown(trajs: list[Any], backend: Backend) -> dict[str, float]:
    """Where an ingested trajectory's CPU goes: the contract's validation (done by the bus
    on every delivery) vs the warehouse's own conversion and insert (µs per trajectory)."""
    from agentrl.contracts.trajectory import TrajectoryEvent
    from agentrl.warehouse import rows
    from agentrl.warehouse.ingest import insert_built

    raws = [t.to_json() for t in trajs]
    t0 = time.perf_counter()
    events = [TrajectoryEvent.model_validate_json(r) for r in raws]
    t1 = time.perf_counter()
    ws = WarehouseSettings(database="bench_cost")
    schema.apply(backend, ws)
    built = rows.build("trajectory", [(e, r, "") for e, r in zip(events, raws, strict=True)], 0)
    t2 = time.perf_counter()
    insert_built(backend, ws.database, built)
    t3 = time.perf_counter()
    n = len(trajs)
    return {
        "validate_us": (t1 - t0) / n * 1e6,
        "convert_us": (t2 - t1) / n * 1e6,
        "insert_us": (t3 - t2) / n * 1e6,
    }


def synthesize(backend: Backend, db: str, trajectories: int = 200_000) -> None:
    """Fill `db` with a synthetic warehouse inside chdb (INSERT ... SELECT, no Python rows)."""
    template = S.trajectory(0, tools=TOOLS).to_json().decode().replace(S.tid(0), "{ID}")
    backend.command(
        f"""INSERT INTO {db}.trajectories
        SELECT concat('t-', toString(number)) AS trajectory_id, concat('s-', toString(number % 997)),
               'agent-zero-main', ['', 'researcher', 'developer'][number % 3 + 1], '',
               concat('task-', toString(number % 5000)),
               ['coding', 'research', 'data_analysis', 'general'][number % 4 + 1],
               concat('v', toString(number % 5)),
               now64(3) - toIntervalMillisecond((number * 2999) % 604800000) AS start_ts,
               start_ts + toIntervalMillisecond(1000 + number % 9000), 1000 + number % 9000,
               1 + number % 9, number % 9, (number % 9) % 3, 500 + number % 1000, 0.002, 0.7,
               ['completed_successfully', 'failed', 'partial_completion'][number % 3 + 1],
               number % 3 = 0, 1.0, replaceOne({{template:String}}, '{{ID}}', trajectory_id),
               now64(3)
        FROM numbers({trajectories})""",
        {"template": template},
    )
    backend.command(
        f"""INSERT INTO {db}.turns
        SELECT trajectory_id, t + 1, start_timestamp + toIntervalMillisecond(t * 10), domain,
               model, if(t + 1 = turn_count, 'response', 'tool_call'),
               if(t + 1 = turn_count, '', ['search', 'code_exe', 'memory', 'browser', 'shell'][(cityHash64(trajectory_id, t) % 5) + 1]),
               20, (cityHash64(trajectory_id, t) % 10) != 0, 1, '',
               (cityHash64(trajectory_id, t, 1) % 2000) / 10.0, 100
        FROM {db}.trajectories ARRAY JOIN range(turn_count) AS t"""
    )
    backend.command(
        f"""INSERT INTO {db}.rewards (reward_id, trajectory_id, session_id, timestamp, version,
               model, total_reward, raw_total_reward, total_reward_kind, reward_type,
               component_names, component_scores, component_weights, component_sources)
        SELECT concat('r-', trajectory_id, '-', toString(v)), trajectory_id, session_id,
               end_timestamp, v, model, ((cityHash64(trajectory_id) % 100) / 100.0) AS r, r,
               'raw', 'sparse', ['task_completion', 'efficiency'], [r, 0.5], [0.6, 0.4],
               ['automated', 'automated']
        FROM {db}.trajectories ARRAY JOIN if(cityHash64(trajectory_id) % 10 = 0, [1, 2], [1]) AS v"""
    )
    backend.command(
        f"""INSERT INTO {db}.feedback (feedback_id, trajectory_id, timestamp, type, rating)
        SELECT concat('f-', toString(number)), concat('t-', toString(number * 10)),
               now64(3) - toIntervalSecond(number), ['thumbs_up', 'thumbs_down', 'rating'][number % 3 + 1],
               if(number % 3 = 2, 1 + number % 5, 0)
        FROM numbers({trajectories // 10})"""
    )
    backend.command(
        f"""INSERT INTO {db}.training_jobs (training_job_id, timestamp, event_id, status, current_step)
        SELECT concat('job-', toString(intDiv(number, 5))), now64(3) - toIntervalSecond(10000 - number),
               toString(number), ['queued', 'running', 'running', 'running', 'completed'][number % 5 + 1],
               number % 5 * 100
        FROM numbers(500)"""
    )
    backend.command(
        f"""INSERT INTO {db}.deployments (deployment_id, training_job_id, timestamp, model_id,
               rollout_strategy, traffic_percentage)
        SELECT concat('d-', toString(number)), concat('job-', toString(number)),
               now64(3) - toIntervalSecond(1000 - number), concat('v', toString(number % 5)),
               'canary', [10, 50, 100][number % 3 + 1]
        FROM numbers(50)"""
    )


QUERY_SET: dict[str, Callable[[Analytics], Any]] = {
    "rewards": lambda a: a.reward_distribution(),
    "success (1 h buckets)": lambda a: a.success_over_time(3600),
    "success (one model)": lambda a: a.success_over_time(86400, model="v1"),
    "lengths": lambda a: a.length_histogram(),
    "slowest tools": lambda a: a.tools(10, "slowest"),
    "failing tools": lambda a: a.tools(10, "failing"),
    "feedback": lambda a: a.feedback_counts(),
    "training": lambda a: a.training_timeline(),
    "deployments": lambda a: a.deployments_timeline(),
    "counts": lambda a: a.counts(),
}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _queries_and_export(
    data: Path, trajectories: int, repeat: int, progress: Callable[[str], None]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    ws = WarehouseSettings(path=data / "chdb", database="bench_queries")
    backend = open_backend(ws, data)
    schema.apply(backend, ws)
    progress(f"generating {trajectories:,} trajectories in chdb")
    synthesize(backend, ws.database, trajectories)
    analytics = Analytics(backend, ws.database)
    counts = analytics.counts()
    rows = []
    for name, fn in QUERY_SET.items():
        progress(f"query: {name}")
        fn(analytics)  # warm
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(analytics)
            times.append((time.perf_counter() - t0) * 1000)
        rows.append(
            {
                "query": name,
                "turns": counts["turns"],
                "p50_ms": statistics.median(times),
                "p99_ms": _pct(times, 0.99),
                "max_ms": max(times),
            }
        )
    from agentrl.warehouse.export import export

    progress("export")
    exports = []
    for _ in range(3):
        t0 = time.perf_counter()
        n = export(backend, ws.database, data / "export.parquet", DatasetFilter(min_reward=0.5))
        exports.append(time.perf_counter() - t0)
    size = (data / "export.parquet").stat().st_size
    t0 = time.perf_counter()
    export(
        backend,
        ws.database,
        data / "export-summary.parquet",
        DatasetFilter(min_reward=0.5),
        include_raw=False,
    )
    summary_s = time.perf_counter() - t0
    return rows, {
        "export_rows": n,
        "export_s": statistics.median(exports),
        "export_s_runs": [round(x, 3) for x in exports],
        "export_mb": size / 1e6,
        "export_summary_only_s": summary_s,
        "counts": counts,
    }


def run(
    n_ingest: int = 20_000,
    trajectories: int = 200_000,
    repeat: int = 30,
    progress: Callable[[str], None] = lambda _m: None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the three parts; returns (table rows, figures)."""
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-warehouse-") as tmp:
        data = Path(tmp)
        ingest = asyncio.run(_ingest(n_ingest, data, progress))
        rows, exp = _queries_and_export(data, trajectories, repeat, progress)
    return rows, {"ingest": ingest, **exp}


def report_rows(rows: list[dict[str, Any]], figs: dict[str, Any]) -> list[dict[str, Any]]:
    """The table of `run`'s result: ingest, its CPU per trajectory, the queries, export."""
    ingest = figs["ingest"]
    blank = {"turns": "", "p50_ms": "", "p99_ms": "", "max_ms": ""}
    return [
        {
            **blank,
            "query": "ingest (JetStream -> chdb)",
            "turns": ingest["stored_turns"],
            "rate": f"{ingest['turns_per_s']:,.0f} turns/s, {ingest['trajectories_per_s']:,.0f} "
            f"traj/s, rewards {ingest['rewards_per_s']:,.0f}/s",
        },
        {
            **blank,
            "query": "ingest CPU per trajectory (us)",
            "rate": f"contract validation {ingest['validate_us']:,.0f}, rows "
            f"{ingest['convert_us']:,.0f}, arrow + insert {ingest['insert_us']:,.0f}",
        },
        *rows,
        {
            **blank,
            "query": f"export {figs['export_rows']:,} trajectories -> Parquet",
            "p50_ms": round(figs["export_s"] * 1000),
            "max_ms": round(max(figs["export_s_runs"]) * 1000),
            "rate": f"{figs['export_mb']:.1f} MB; summary columns only "
            f"{figs['export_summary_only_s']:.2f}s",
        },
    ]


def figures(rows: list[dict[str, Any]], figs: dict[str, Any]) -> dict[str, Any]:
    """The JSON line: ingest rate, the slowest query's p50 and p99, export seconds, lost."""

    def worst(key: str) -> float:
        return round(max(r[key] for r in rows if isinstance(r[key], float)), 1)

    return {
        "turns_per_s": round(figs["ingest"]["turns_per_s"], 1),
        "query_p50_ms": worst("p50_ms"),
        "query_p99_ms": worst("p99_ms"),
        "export_s": round(figs["export_s"], 3),
        "lost": figs["ingest"]["lost"],
    }


def command(cfg: WarehouseBench) -> None:
    """`agentrl bench warehouse`: the run with a spinner, the table and the JSON line."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from agentrl.bench.report import report

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("starting", total=None)
        rows, figs = run(
            cfg.n,
            cfg.trajectories,
            cfg.repeat,
            progress=lambda m: bar.update(task, description=m),
        )
    report("warehouse", report_rows(rows, figs), figures(rows, figs))
