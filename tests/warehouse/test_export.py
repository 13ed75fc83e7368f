"""Dataset export: every filter of the training request against hand-built data."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from agentrl.contracts.training import Dataset, DatasetFilter
from agentrl.core.settings import Settings
from agentrl.warehouse import samples as S
from agentrl.warehouse.export import (
    clickhouse_load_data,
    clickhouse_source,
    export,
    select_dataset,
)

from .conftest import store

TOOLS = {1: [("a", True, 1.0)], 2: [("a", True, 1.0)] * 2, 3: [("a", True, 1.0)] * 3}


@pytest.fixture()
def data(backend, wsettings):  # type: ignore[no-untyped-def]
    """20 trajectories: i%4 -> domain, i%3 -> profile, i%3+1 tool turns (+1 response),
    ended at BASE + i hours; reward i/20 (trajectory 19 has none; 0 has v2 = 0.99)."""
    domains = ["coding", "research", "data_analysis", "general"]
    profiles = [None, "researcher", "developer"]
    events = []
    for i in range(20):
        events.append(
            S.trajectory(
                i,
                domain=domains[i % 4],
                profile=profiles[i % 3],
                tools=TOOLS[i % 3 + 1],
                start=S.BASE + timedelta(hours=i),
            )
        )
        if i != 19:
            events.append(S.reward(i, i / 20))
    events.append(S.reward(0, 0.99, version=2))
    assert store(backend, wsettings.database, events) == {}
    assert store(backend, wsettings.database, events[:10]) == {}  # redelivered
    return backend, wsettings.database


def ids(table) -> set[int]:  # type: ignore[no-untyped-def]
    return {int(t.split("-")[-1], 16) - 1 for t in table.column("trajectory_id").to_pylist()}


def test_filters(data) -> None:  # type: ignore[no-untyped-def]
    backend, db = data
    rewarded = set(range(19))
    assert ids(select_dataset(backend, db)) == rewarded
    got = select_dataset(backend, db, DatasetFilter(min_reward=0.5))
    assert ids(got) == {0} | set(range(10, 19))  # 0 through its v2 reward
    assert ids(select_dataset(backend, db, DatasetFilter(max_trajectory_length=2))) == {
        i for i in rewarded if i % 3 == 0
    }
    window = DatasetFilter.model_validate(
        {
            "date_range": {
                "start": (S.BASE + timedelta(hours=5)).isoformat(),
                "end": (S.BASE + timedelta(hours=8, minutes=1)).isoformat(),
            }
        }
    )
    assert ids(select_dataset(backend, db, window)) == {5, 6, 7, 8}
    doms = DatasetFilter.model_validate({"task_domains": ["coding", "research"]})
    assert ids(select_dataset(backend, db, doms)) == {i for i in rewarded if i % 4 in (0, 1)}
    prof = DatasetFilter(exclude_subordinate_profiles=["researcher", "developer"])
    assert ids(select_dataset(backend, db, prof)) == {i for i in rewarded if i % 3 == 0}
    both = DatasetFilter.model_validate(
        {
            "min_reward": 0.3,
            "task_domains": ["coding"],
            "exclude_subordinate_profiles": ["developer"],
        }
    )
    # coding: 0 (v2 0.99), 4 (0.2), 8 (a developer's), 12 (0.6), 16 (0.8)
    assert ids(select_dataset(backend, db, both)) == {0, 12, 16}
    all_too = select_dataset(backend, db, require_reward=False)
    assert ids(all_too) == set(range(20))
    assert all_too.column("reward").to_pylist().count(None) == 1


def test_sample_is_deterministic_and_sized(data) -> None:  # type: ignore[no-untyped-def]
    backend, db = data
    a = ids(select_dataset(backend, db, sample_size=5, seed=1))
    assert len(a) == 5 and a == ids(select_dataset(backend, db, sample_size=5, seed=1))
    others = [ids(select_dataset(backend, db, sample_size=5, seed=s)) for s in range(2, 6)]
    assert any(o != a for o in others)


def test_latest_reward_and_files(data, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    backend, db = data
    n = export(backend, db, tmp_path / "d.parquet", DatasetFilter(min_reward=0.9))
    table = pq.read_table(tmp_path / "d.parquet")
    assert n == table.num_rows == 2  # 0 (v2 0.99) and 18 (0.9)
    rows = {r["trajectory_id"]: r for r in table.to_pylist()}
    assert rows[S.tid(0)]["reward"] == pytest.approx(0.99) and rows[S.tid(0)]["reward_version"] == 2
    assert json.loads(rows[S.tid(18)]["raw_json"])["trajectory_id"] == S.tid(18)
    n = export(backend, db, tmp_path / "d.jsonl", DatasetFilter(min_reward=0.9))
    lines = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert n == len(lines) == 2
    assert {x["trajectory"]["trajectory_id"] for x in lines} == {S.tid(0), S.tid(18)}
    assert all(x["domain"] in ("coding", "data_analysis", "research", "general") for x in lines)


def test_clickhouse_source(data, wsettings, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AGENTRL_WAREHOUSE_PATH", str(wsettings.path))
    monkeypatch.setenv("AGENTRL_CLICKHOUSE_DATABASE", wsettings.database)
    dataset = Dataset.model_validate(
        {"source": "clickhouse", "filter": {"min_reward": 0.5}, "sample_size": 4}
    )
    got = clickhouse_source(dataset, Settings(data_dir=wsettings.path))
    assert len(got) == 4
    assert all(g.reward >= 0.5 and g.trajectory.trajectory_id for g in got)
    assert {g.trajectory.task_context.domain for g in got} <= {
        "coding",
        "research",
        "data_analysis",
        "general",
    }
    data = clickhouse_load_data(dataset, Settings(data_dir=wsettings.path))
    assert len(data["trajectories"]) == len(data["rewards"]) == 4
    assert {t["trajectory_id"] for t in data["trajectories"]} == {
        r["trajectory_id"] for r in data["rewards"]
    }
    assert all(r["total_reward"] >= 0.5 and r["version"] >= 1 for r in data["rewards"])
