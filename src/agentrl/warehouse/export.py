"""Dataset export with the training request's filters, and the `clickhouse` dataset source.

`select_dataset` is one SQL query: the trajectories (FINAL) joined with each one's latest
reward (argMax over the version), filtered by the seed's `dataset.filter` fields, sampled
deterministically (`sample_size` rows ordered by a seeded hash of the id). `export` writes
the result to Parquet or JSONL; `clickhouse_source` is what a training job calls.

Filter semantics (the same as the training service's JetStream source):
  min_reward             latest reward >= min_reward (trajectories without a reward are
                         left out whenever a reward is required, which is the default)
  max_trajectory_length  turn count <= max_trajectory_length
  date_range             start <= end_timestamp <= end (when the trajectory finished)
  task_domains           domain in the list (empty: all)
  exclude_subordinate_profiles  subordinate profile not in the list
  agent_ids              agent_id in the list (empty: all)
  sample_size            at most this many, a deterministic sample for a given seed
The filter set is declared once in `agentrl.contracts.filters` (both sources read it there; a
field neither applies is refused).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
import pyarrow as pa

from agentrl.contracts.filters import declared
from agentrl.contracts.training import Dataset, DatasetFilter
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.core.logs import audit
from agentrl.core.settings import Settings, get_settings
from agentrl.warehouse.backend import Backend
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.queries import latest_rewards_sql, ts_param

Format = Literal["parquet", "jsonl"]

SUMMARY_COLUMNS = (
    "trajectory_id",
    "session_id",
    "agent_id",
    "subordinate_profile",
    "task_id",
    "domain",
    "model",
    "start_timestamp",
    "end_timestamp",
    "turn_count",
    "success",
    "task_status",
    "total_tokens",
)


def dataset_sql(
    database: str,
    filt: DatasetFilter,
    sample_size: int | None,
    *,
    seed: int = 0,
    require_reward: bool = True,
    include_raw: bool = True,
) -> tuple[str, dict[str, Any]]:
    """The export query and its parameters (pure: testable without a warehouse). Raises
    ValueError for a filter field that is not declared (`training.filters.FILTERS`)."""
    f = declared(filt)
    params: dict[str, Any] = {"seed": int(seed) % 2**64}
    where = ["1"]
    if f.max_trajectory_length is not None:
        params["max_len"] = min(int(f.max_trajectory_length), 2**32 - 1)
        where.append("turn_count <= {max_len:UInt32}")
    if f.start is not None and f.end is not None:
        params["start"] = ts_param(f.start)
        params["end"] = ts_param(f.end)
        where.append("end_timestamp BETWEEN {start:DateTime64(3)} AND {end:DateTime64(3)}")
    if f.task_domains:
        params["domains"] = list(f.task_domains)
        where.append("domain IN {domains:Array(String)}")
    if f.exclude_subordinate_profiles:
        params["profiles"] = list(f.exclude_subordinate_profiles)
        where.append("subordinate_profile NOT IN {profiles:Array(String)}")
    if f.agent_ids:
        params["agents"] = list(f.agent_ids)
        where.append("agent_id IN {agents:Array(String)}")
    having = "1"
    if f.min_reward is not None:
        params["min_reward"] = float(f.min_reward)
        having = "reward >= {min_reward:Float64}"
        require_reward = True
    columns = ", ".join(f"t.{c} AS {c}" for c in SUMMARY_COLUMNS)
    inner = ", ".join(("tkey", *SUMMARY_COLUMNS, *(("raw_json",) if include_raw else ())))
    raw = ", t.raw_json AS raw_json" if include_raw else ""
    join = "INNER JOIN" if require_reward else "LEFT JOIN"
    latest = latest_rewards_sql(database, having)
    tail = ""
    if sample_size is not None:
        # Deterministic sample: the ids with the smallest seeded hash. They are picked first
        # without the stored JSON, so only the sampled rows' JSON is read and sorted.
        params["sample"] = min(int(sample_size), 2**63)
        order = "ORDER BY cityHash64({t}.trajectory_id, {{seed:UInt64}}), {t}.trajectory_id"
        picked = f"""
            SELECT tkey FROM (SELECT tkey, trajectory_id FROM {database}.trajectories FINAL
                              WHERE {" AND ".join(where)}) AS p
            {join} ({latest}) AS pr USING tkey
            {order.format(t="p")} LIMIT {{sample:UInt64}}"""
        where = [*where, f"tkey IN ({picked})"]
        tail = order.format(t="t")
    sql = f"""
        SELECT {columns}, r.reward AS reward, r.reward_version AS reward_version,
               r.correction AS correction, r.turn_rewards AS turn_rewards{raw}
        FROM (SELECT {inner} FROM {database}.trajectories FINAL
              WHERE {" AND ".join(where)}) AS t
        {join} ({latest}) AS r USING tkey
        {tail}
        SETTINGS join_use_nulls = 1, do_not_merge_across_partitions_select_final = 1"""
    return sql, params


def select_dataset(
    backend: Backend,
    database: str,
    filt: DatasetFilter | None = None,
    sample_size: int | None = None,
    *,
    seed: int = 0,
    require_reward: bool = True,
    include_raw: bool = True,
) -> pa.Table:
    sql, params = dataset_sql(
        database,
        filt or DatasetFilter(),
        sample_size,
        seed=seed,
        require_reward=require_reward,
        include_raw=include_raw,
    )
    table = backend.query(sql, params)
    audit("data.read", source="warehouse", rows=int(table.num_rows), sample_size=sample_size,
          filter=(filt or DatasetFilter()).model_dump(mode="json", exclude_none=True))  # fmt: skip
    return table


def to_bytes(table: pa.Table, fmt: Format) -> bytes:
    """Parquet (zstd) or JSONL bytes; in JSONL the stored trajectory is a nested object."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        return sink.getvalue()
    out = io.BytesIO()
    names = [n for n in table.column_names if n != "raw_json"]
    raws = table.column("raw_json").to_pylist() if "raw_json" in table.column_names else None
    for i, row in enumerate(table.select(names).to_pylist()):
        line = orjson.dumps(row, option=orjson.OPT_NAIVE_UTC)
        if raws is not None:
            line = line[:-1] + b',"trajectory":' + raws[i].encode() + b"}"
        out.write(line + b"\n")
    return out.getvalue()


def export(
    backend: Backend,
    database: str,
    path: str | Path,
    filt: DatasetFilter | None = None,
    sample_size: int | None = None,
    *,
    fmt: Format | None = None,
    seed: int = 0,
    include_raw: bool = True,
) -> int:
    """Write the filtered dataset to `path` (.parquet or .jsonl); returns the row count."""
    path = Path(path)
    fmt = fmt or ("jsonl" if path.suffix in (".jsonl", ".json") else "parquet")
    table = select_dataset(backend, database, filt, sample_size, seed=seed, include_raw=include_raw)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path, compression="zstd")
    else:
        path.write_bytes(to_bytes(table, "jsonl"))
    audit("data.export", destination=str(path), rows=int(table.num_rows), format=fmt)
    return int(table.num_rows)


@dataclass(frozen=True)
class RewardedTrajectory:
    """One training example from the warehouse: the stored (redacted) trajectory and the
    total of its latest reward version."""

    trajectory: TrajectoryEvent
    reward: float
    reward_version: int
    correction: str = ""  # the user's correction carried by that reward version
    turn_rewards: tuple[float, ...] = ()  # its per-turn rewards (partial credit), () if none


def rewarded_from_table(table: pa.Table) -> list[RewardedTrajectory]:
    raws = table.column("raw_json").to_pylist()
    rewards = table.column("reward").to_pylist()
    versions = table.column("reward_version").to_pylist()
    fixes = (
        table.column("correction").to_pylist()
        if "correction" in table.column_names
        else [""] * len(raws)
    )
    turns = (
        table.column("turn_rewards").to_pylist()
        if "turn_rewards" in table.column_names
        else [None] * len(raws)
    )
    return [
        RewardedTrajectory(
            TrajectoryEvent.model_validate_json(raw), float(r), int(v), c or "", tuple(t or ())
        )
        for raw, r, v, c, t in zip(raws, rewards, versions, fixes, turns, strict=True)
    ]


def clickhouse_source(
    dataset: Dataset,
    settings: Settings | None = None,
    *,
    seed: int = 0,
    api_url: str | None = None,
    api_token: str | None = None,
    timeout_s: float = 60.0,
) -> list[RewardedTrajectory]:
    """The `clickhouse` dataset source of a training request (`dataset.source == "clickhouse"`).

    Returns the trajectories matching `dataset.filter`, each with its latest reward, at most
    `dataset.sample_size` of them (a deterministic sample for `seed`). It reads the
    warehouse directly when this process may (a ClickHouse server via AGENTRL_CLICKHOUSE_URL,
    or the embedded chdb when this process owns it, as the services of `agentrl up` do);
    with `api_url` it asks the control API's `POST /stats/export` instead (for a process
    beside the one that owns chdb, e.g. a training job's child process). Blocking: call it
    through `asyncio.to_thread` from async code.
    """
    if api_url is not None:
        import httpx
        import pyarrow.parquet as pq

        headers = {"Authorization": f"Bearer {api_token}"} if api_token else {}
        body = {
            "filter": dataset.filter.model_dump(mode="json", exclude_none=True),
            "sample_size": dataset.sample_size,
            "seed": seed,
            "format": "parquet",
        }
        response = httpx.post(
            api_url.rstrip("/") + "/stats/export", json=body, headers=headers, timeout=timeout_s
        )
        response.raise_for_status()
        return rewarded_from_table(pq.read_table(io.BytesIO(response.content)))
    from agentrl.warehouse.access import open_migrated

    settings = settings or get_settings()
    wsettings = WarehouseSettings()
    backend = open_migrated(settings, wsettings)  # an empty warehouse: an empty dataset
    table = select_dataset(
        backend, wsettings.database, dataset.filter, dataset.sample_size, seed=seed
    )
    return rewarded_from_table(table)


def clickhouse_load_data(
    dataset: Dataset,
    settings: Settings | None = None,
    *,
    seed: int = 0,
    api_url: str | None = None,
    api_token: str | None = None,
) -> dict[str, Any]:
    """The same rows as `clickhouse_source`, shaped like the training service's JetStream
    loader (`{"trajectories": [payload dicts], "rewards": [{"trajectory_id", "total_reward",
    "version"}]}`: one latest reward per trajectory), so a dataset job can take either."""
    rows = clickhouse_source(dataset, settings, seed=seed, api_url=api_url, api_token=api_token)
    return load_data_payloads(rows)


def load_data_payloads(rows: list[RewardedTrajectory]) -> dict[str, Any]:
    """Warehouse rows as the JetStream loader's payloads (`clickhouse_load_data`)."""
    return {
        "trajectories": [r.trajectory.to_wire() for r in rows],
        "rewards": [
            {
                "trajectory_id": r.trajectory.trajectory_id,
                "total_reward": r.reward,
                "version": r.reward_version,
                # the user's correction (Record.correction) and the per-turn rewards
                # (Record.turn_rewards) where the reward carries them
                "metadata": {
                    **({"feedback": {"correction": r.correction}} if r.correction else {}),
                    **({"turn_rewards": list(r.turn_rewards)} if r.turn_rewards else {}),
                },
            }
            for r in rows
        ],
    }
