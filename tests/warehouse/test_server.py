"""The same schema, ingest path, queries and export against a ClickHouse server.

Runs only when AGENTRL_CLICKHOUSE_URL points at a server (no server can be installed on the
build machine); a fresh database per run, dropped afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from agentrl.contracts.training import DatasetFilter
from agentrl.warehouse import samples as S
from agentrl.warehouse import schema
from agentrl.warehouse.backend import ServerBackend
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.export import select_dataset
from agentrl.warehouse.queries import Analytics

from .conftest import store

URL = os.environ.get("AGENTRL_CLICKHOUSE_URL")
pytestmark = pytest.mark.skipif(
    not URL,
    reason="AGENTRL_CLICKHOUSE_URL is not set: no ClickHouse server to test against "
    "(set it, plus AGENTRL_CLICKHOUSE_USER/PASSWORD, to run these)",
)


@pytest.fixture()
def server() -> Iterator[tuple[ServerBackend, WarehouseSettings]]:
    ws = WarehouseSettings(database=f"agentrl_test_{uuid.uuid4().hex[:8]}")
    backend = ServerBackend(ws.clickhouse_url or "", ws.clickhouse_user, ws.clickhouse_password)
    schema.apply(backend, ws)
    yield backend, ws
    backend.command(f"DROP DATABASE IF EXISTS {ws.database}")
    backend.close()


def test_schema_ingest_queries_export(server: tuple[ServerBackend, WarehouseSettings]) -> None:
    backend, ws = server
    assert schema.apply(backend, ws) == []
    events = [S.trajectory(i, domain=("coding", "research")[i % 2]) for i in range(10)]
    events += [S.reward(i, i / 10) for i in range(10)] + [S.reward(0, 0.95, version=2)]
    assert store(backend, ws.database, events) == {}
    assert store(backend, ws.database, events) == {}  # redelivered: collapses
    analytics = Analytics(backend, ws.database)
    counts = analytics.counts()
    assert counts["trajectories"] == 10 and counts["turns"] == 30 and counts["rewards"] == 11
    dist = {r["domain"]: r for r in analytics.reward_distribution()}
    assert dist["coding"]["trajectories"] == 5
    got = select_dataset(
        backend,
        ws.database,
        DatasetFilter.model_validate({"min_reward": 0.5, "task_domains": ["coding"]}),
    )
    assert sorted(got.column("reward").to_pylist()) == [0.6, 0.8, 0.95]
