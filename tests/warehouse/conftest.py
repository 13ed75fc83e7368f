"""Warehouse fixtures: one real chdb data path per test session (chdb allows one path per
process), a fresh database per test so tests never see each other's rows."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentrl.contracts.deployment import ModelDeployed
from agentrl.contracts.feedback import FeedbackEvent
from agentrl.contracts.reward import RewardEvent
from agentrl.contracts.training import TrainingStatus
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.warehouse import rows, schema
from agentrl.warehouse.backend import Backend, open_backend
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.ingest import insert_built

KIND_OF = {
    TrajectoryEvent: "trajectory",
    RewardEvent: "reward",
    FeedbackEvent: "feedback",
    TrainingStatus: "training_status",
    ModelDeployed: "deployment",
}


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture()
def wsettings(chdb_path: Path) -> WarehouseSettings:
    return WarehouseSettings(path=chdb_path, database=f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture()
def backend(wsettings: WarehouseSettings) -> Iterator[Backend]:
    b = open_backend(wsettings, wsettings.path or Path("."))
    schema.apply(b, wsettings)
    yield b
    b.command(f"DROP DATABASE IF EXISTS {wsettings.database}")


def store(backend: Backend, database: str, events: Sequence[Any]) -> dict[int, str]:
    """Insert events through the ingester's own conversion and insert path (no bus)."""
    bad: dict[int, str] = {}
    by_kind: dict[str, list[Any]] = {}
    for ev in events:
        by_kind.setdefault(KIND_OF[type(ev)], []).append(ev)
    for kind, evs in by_kind.items():
        items = [(e, e.to_json(), e.msg_id()) for e in evs]
        built = rows.build(kind, items, int(time.time() * 1000))
        bad.update(insert_built(backend, database, built))
    return bad
