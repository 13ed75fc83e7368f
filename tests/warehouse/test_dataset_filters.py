"""One declared filter set, two dataset sources: the JetStream loader of a training job (a
real nats-server) and the warehouse source (real chdb) pick the same trajectories from the
same events for every filter, `agent_ids` included; an undeclared filter is refused by both."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agentrl.bus import Bus, EmbeddedNats
from agentrl.contracts.filters import FILTERS
from agentrl.contracts.training import DatasetFilter, TrainingRequest
from agentrl.core.settings import Settings
from agentrl.training.dataset import apply_filters, latest_rewards
from agentrl.training.jobs import load_data
from agentrl.training.requests import fill_request
from agentrl.training.settings import TrainingSettings
from agentrl.warehouse import samples as S
from agentrl.warehouse.export import select_dataset

from .conftest import store

AGENTS = ["agent-a", "agent-b", "agent-c"]
DOMAINS = ["coding", "research", "general"]
PROFILES = [None, "researcher", "developer", "hacker"]


def events() -> list[Any]:
    """24 trajectories over three agents, domains, four profiles, 1-3 tool turns, an hour
    apart; reward i/24 (trajectory 23 has none, trajectory 1 also has v2 = 0.99)."""
    out: list[Any] = []
    for i in range(24):
        t = S.trajectory(
            i,
            domain=DOMAINS[i % 3],
            profile=PROFILES[i % 4],
            tools=[("a", True, 1.0)] * (i % 3 + 1),
            start=S.BASE + timedelta(hours=i),
        )
        out.append(t.model_copy(update={"agent_id": AGENTS[(i // 2) % 3]}))
        if i != 23:
            out.append(S.reward(i, i / 24))
    out.append(S.reward(1, 0.99, version=2))
    return out


FILTER_CASES: list[dict[str, Any]] = [
    {},
    {"agent_ids": ["agent-b"]},
    {"agent_ids": ["agent-a", "agent-c"]},
    {"min_reward": 0.5},
    {"max_trajectory_length": 3},
    {
        "date_range": {
            "start": (S.BASE + timedelta(hours=4)).isoformat(),
            "end": (S.BASE + timedelta(hours=9, minutes=30)).isoformat(),
        }
    },
    {"task_domains": ["coding", "research"]},
    {"exclude_subordinate_profiles": ["researcher", "hacker"]},
    {"agent_ids": ["agent-a"], "min_reward": 0.2, "task_domains": ["coding", "general"]},
]


def test_every_declared_filter_has_a_case() -> None:
    used = {k for case in FILTER_CASES for k in case}
    assert used == set(FILTERS)


async def _jetstream_ids(tmp_path: Path, evs: list[Any], cases: list[dict[str, Any]]) -> list[set]:
    server = EmbeddedNats(data_dir=tmp_path / "nats")
    server.start()
    try:
        bus = await Bus.connect(server.url, settings=Settings(nats_url=server.url))
        await bus.ensure_streams()
        await bus.publish_many(evs)
        await bus.close()
        out = []
        for flt in cases:
            req = fill_request(
                {"training_config": {"dataset": {"filter": flt}}}, TrainingSettings()
            )
            data = await load_data({"request": json.loads(req.to_json()), "nats_url": server.url})
            records, _ = apply_filters(
                data["trajectories"],
                latest_rewards(data["rewards"]),
                TrainingRequest.model_validate(req).training_config.dataset.filter,
            )
            out.append({r.trajectory_id for r in records})
        return out
    finally:
        server.stop()


def test_jetstream_loader_and_warehouse_pick_the_same_trajectories(backend, wsettings, tmp_path):
    evs = events()
    assert store(backend, wsettings.database, evs) == {}
    from_stream = asyncio.run(_jetstream_ids(tmp_path, evs, FILTER_CASES))
    for case, stream_ids in zip(FILTER_CASES, from_stream, strict=True):
        table = select_dataset(backend, wsettings.database, DatasetFilter.model_validate(case))
        warehouse_ids = set(table.column("trajectory_id").to_pylist())
        assert warehouse_ids == stream_ids, case
        assert stream_ids or case.get("agent_ids") is None, case
    by_agent = dict(zip(map(json.dumps, FILTER_CASES), from_stream, strict=True))
    only_b = by_agent[json.dumps({"agent_ids": ["agent-b"]})]
    assert only_b and len(only_b) < len(from_stream[0]), "agent_ids narrows the dataset"
    agent_of = {e.trajectory_id: e.agent_id for e in evs if hasattr(e, "agent_id")}
    assert {agent_of[t] for t in only_b} == {"agent-b"}


def test_an_undeclared_filter_is_refused_by_both_sources(backend, wsettings):
    flt = DatasetFilter.model_validate({"agent_id": ["agent-b"]})  # a typo of agent_ids
    with pytest.raises(ValueError, match=r"unknown dataset\.filter field"):
        select_dataset(backend, wsettings.database, flt)
    with pytest.raises(ValueError, match=r"unknown dataset\.filter field"):
        apply_filters([], {}, flt)
