"""Migrations are idempotent, a newer stored schema is refused, and retention works: the TTL
clauses are in every table and the engine really archives (recompresses) and deletes rows."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agentrl.core.settings import Settings
from agentrl.warehouse import samples as S
from agentrl.warehouse import schema
from agentrl.warehouse.backend import Backend, SchemaTooNew, open_backend
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.queries import Analytics
from agentrl.warehouse.service import IngesterService

from .conftest import store

TABLES = {
    "trajectories",
    "turns",
    "rewards",
    "feedback",
    "training_jobs",
    "deployments",
    "model_versions",
}


def created(backend: Backend, db: str) -> dict[str, str]:
    rows = backend.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = {db:String}",
        {"db": db},
    ).to_pylist()
    return {r["name"]: r["create_table_query"] for r in rows}


def test_schema_applied_twice_without_change(
    backend: Backend, wsettings: WarehouseSettings
) -> None:
    first = created(backend, wsettings.database)
    assert set(first) == TABLES | {"schema_migrations"}
    assert schema.apply(backend, wsettings) == []
    assert created(backend, wsettings.database) == first
    assert schema.current_version(backend, wsettings) == schema.LATEST == 10
    for name, sql in first.items():
        if name in TABLES:
            assert "ReplacingMergeTree" in sql, name
    assert "`model` LowCardinality(String)" in first["trajectories"]
    assert "`tool_name` LowCardinality(String)" in first["turns"]
    assert "PARTITION BY toDate(end_timestamp)" in first["trajectories"]


def test_ttl_clauses_present_and_configurable(
    backend: Backend, wsettings: WarehouseSettings
) -> None:
    tables = created(backend, wsettings.database)
    for name, column in schema.TTL_TABLES.items():
        sql = tables[name]
        assert (
            f"TTL toDateTime({column}) + toIntervalSecond(2592000) RECOMPRESS CODEC(ZSTD(17))"
            in sql
        )
        assert f"toDateTime({column}) + toIntervalSecond(7776000)" in sql
    shorter = wsettings.model_copy(update={"hot_ttl_s": 7 * 86400, "delete_ttl_s": 14 * 86400})
    did = schema.apply(backend, shorter)
    assert len(did) == 4 and all(d.startswith("retention of") for d in did)
    assert "toIntervalSecond(604800) RECOMPRESS" in created(backend, wsettings.database)["turns"]
    assert schema.apply(backend, shorter) == []


def test_newer_schema_refused(backend: Backend, wsettings: WarehouseSettings) -> None:
    db = wsettings.database
    backend.command(
        f"INSERT INTO {db}.schema_migrations (version, name, checksum) VALUES (99, 'future', '')"
    )
    with pytest.raises(SchemaTooNew, match="version 99, newer than this agentrl knows"):
        schema.apply(backend, wsettings)
    service = IngesterService(bus=None, settings=Settings(data_dir=Path(".")), wsettings=wsettings)  # type: ignore[arg-type]
    with pytest.raises(SchemaTooNew):
        asyncio.run(service.run(asyncio.Event()))
    assert service.status.state == "failed"


def parts(backend: Backend, db: str) -> list[dict[str, object]]:
    return backend.query(
        "SELECT partition, rows, default_compression_codec AS codec FROM system.parts "
        "WHERE database = {db:String} AND table = 'trajectories' AND active AND rows > 0 "
        "ORDER BY partition",
        {"db": db},
    ).to_pylist()


def test_ttl_archives_then_deletes(chdb_path: Path) -> None:
    """Short test TTL: hot 1 hour, deleted after 3 days; rows of now, 2 and 5 days ago."""
    ws = WarehouseSettings(
        path=chdb_path,
        database=f"ttl_{uuid.uuid4().hex[:8]}",
        hot_ttl_s=3600,
        delete_ttl_s=3 * 86400,
    )
    backend = open_backend(ws, chdb_path)
    schema.apply(backend, ws)
    now = datetime.now(UTC)
    ages = {0: timedelta(0), 1: timedelta(days=2), 2: timedelta(days=5)}
    assert (
        store(backend, ws.database, [S.trajectory(i, start=now - a) for i, a in ages.items()]) == {}
    )
    backend.command(f"OPTIMIZE TABLE {ws.database}.trajectories FINAL")
    got = parts(backend, ws.database)
    today, two_days = now.date().isoformat(), (now - ages[1]).date().isoformat()
    assert [(p["partition"], p["rows"]) for p in got] == [(two_days, 1), (today, 1)]
    codec = {p["partition"]: p["codec"] for p in got}
    assert codec == {two_days: "ZSTD(17)", today: "LZ4"}  # archived vs hot
    assert Analytics(backend, ws.database).counts()["trajectories"] == 2
    # and in real time: rows that age past a 3-second hot TTL get archived (1 s was too short
    # under load: a part written more than a second after its rows' start is archived at once)
    quick = ws.model_copy(update={"database": f"ttlq_{uuid.uuid4().hex[:8]}", "hot_ttl_s": 3})
    schema.apply(backend, quick)
    start = time.monotonic()
    store(backend, quick.database, [S.trajectory(i, start=datetime.now(UTC)) for i in range(3)])
    assert [p["codec"] for p in parts(backend, quick.database)] == ["LZ4"]
    time.sleep(max(0.0, 3.1 - (time.monotonic() - start)))
    backend.command(f"OPTIMIZE TABLE {quick.database}.trajectories FINAL")
    assert [(p["rows"], p["codec"]) for p in parts(backend, quick.database)] == [(3, "ZSTD(17)")]
    for db in (ws.database, quick.database):
        backend.command(f"DROP DATABASE {db}")


def test_correction_columns_reach_an_older_warehouse_and_the_dataset(
    chdb_path: Path,
) -> None:
    """A warehouse at schema 7 (before corrections) gets the `correction` columns by
    migrations 8 and 9; a reward version and a feedback event carrying a correction store
    it, and the dataset query returns it with the trajectory's latest reward."""
    from agentrl.warehouse.export import rewarded_from_table, select_dataset

    ws = WarehouseSettings(path=chdb_path, database=f"t_{uuid.uuid4().hex[:12]}")
    b = open_backend(ws, chdb_path)
    try:
        db = ws.database
        b.command(f"CREATE DATABASE IF NOT EXISTS {db}")
        b.command(
            f"CREATE TABLE IF NOT EXISTS {db}.schema_migrations (version UInt32, name String, "
            "checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
            "ENGINE = MergeTree ORDER BY version"
        )
        for m in schema.load_migrations()[:7]:  # what an older agentrl left
            b.command(m.render(ws))
            b.command(
                f"INSERT INTO {db}.schema_migrations (version, name, checksum) VALUES "
                f"({m.version}, '{m.name}', '{m.checksum}')"
            )
        old = created(b, db)
        assert "correction" not in old["rewards"] and "correction" not in old["feedback"]
        did = schema.apply(b, ws)
        assert did[-3:-1] == [
            "applied 0008_rewards_correction",
            "applied 0009_feedback_correction",
        ]
        assert "`correction` String" in created(b, db)["rewards"]
        assert "`correction` String" in created(b, db)["feedback"]

        fix = "read the CSV first"
        v1 = S.reward(1, 0.0)
        v2 = v1.model_copy(
            update={
                "reward_id": str(uuid.uuid4()),
                "metadata": v1.metadata.model_copy(
                    update={
                        "version": 2,
                        "feedback": {"explicit": "thumbs_down", "correction": fix},
                    }
                ),
            }
        )
        fb = S.feedback(1, "thumbs_down").model_copy(update={"correction": fix})
        assert store(b, db, [S.trajectory(1), S.trajectory(2), v1, v2, S.reward(2, 1.0), fb]) == {}
        rows = b.query(
            f"SELECT version, correction FROM {db}.rewards ORDER BY trajectory_id, version"
        ).to_pylist()
        assert {(r["version"], r["correction"]) for r in rows} == {(1, ""), (2, fix)}
        (frow,) = b.query(f"SELECT correction FROM {db}.feedback").to_pylist()
        assert frow["correction"] == fix
        got = {r.trajectory.trajectory_id: r for r in rewarded_from_table(select_dataset(b, db))}
        assert got[S.tid(1)].correction == fix and got[S.tid(1)].reward_version == 2
        assert got[S.tid(2)].correction == ""
    finally:
        b.command(f"DROP DATABASE IF EXISTS {ws.database}")


def test_turn_rewards_reach_the_warehouse_dataset(
    backend: Backend, wsettings: WarehouseSettings
) -> None:
    """Per-turn rewards (partial credit, `metadata.turn_rewards`) are stored with their reward
    version (migration 10) and the warehouse dataset source gives them to a job's records
    (`Record.turn_rewards`, GiGPO's step rewards), the latest version's; none stay none."""
    from agentrl.contracts.training import DatasetFilter
    from agentrl.training.dataset import apply_filters, latest_rewards
    from agentrl.warehouse.export import rewarded_from_table, select_dataset

    db = wsettings.database
    assert "`turn_rewards` Array(Float64)" in created(backend, db)["rewards"]
    t1 = S.trajectory(1)  # three turns: two tool calls and the final response
    v1 = S.reward(1, 0.3)
    v1 = v1.model_copy(
        update={"metadata": v1.metadata.model_copy(update={"turn_rewards": [0.1, 0.2, 0.0]})}
    )
    v2 = v1.model_copy(
        update={
            "reward_id": str(uuid.uuid4()),
            "metadata": v1.metadata.model_copy(
                update={"version": 2, "turn_rewards": [0.1, 0.1, 0.1]}
            ),
        }
    )
    assert store(backend, db, [t1, S.trajectory(2), v1, v2, S.reward(2, 1.0)]) == {}
    got = {r.trajectory.trajectory_id: r for r in rewarded_from_table(select_dataset(backend, db))}
    assert got[S.tid(1)].turn_rewards == (0.1, 0.1, 0.1)  # the latest version's
    assert got[S.tid(2)].turn_rewards == ()
    from agentrl.warehouse.export import load_data_payloads

    data = load_data_payloads(rewarded_from_table(select_dataset(backend, db)))
    kept, _ = apply_filters(data["trajectories"], latest_rewards(data["rewards"]), DatasetFilter())
    by_id = {r.trajectory_id: r for r in kept}
    assert by_id[S.tid(1)].turn_rewards == [0.1, 0.1, 0.1]
    assert by_id[S.tid(2)].turn_rewards is None
