"""Shared fixtures: one real embedded nats-server (JetStream) per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The files that take half a minute or more (seconds summed over their tests, measured with
# --durations=0 on 2 cores, 2026-11-27), longest first. scripts/test.sh hands whole files to
# two workers in collection order (--dist loadfile --no-loadscope-reorder): with these first,
# the short files fill in at the end, instead of one worker finishing a two-minute file
# alone (xdist's own reorder puts the files with the most tests first, so these came last).
SLOW_FILES_FIRST = (
    "tests/training/test_runner_replicas.py",
    "tests/loop/test_loop_quick.py",
    "tests/training/test_training_service.py",
    "tests/loop/test_loop_tooluse.py",
    "tests/offpolicy/test_offpolicy_train.py",
    "tests/offpolicy/test_offpolicy_apex.py",
    "tests/offpolicy/test_offpolicy_cli.py",
    "tests/deploy/test_release_actions.py",
    "tests/rewards/test_replicas.py",
    "tests/deploy/test_gateway_replicas.py",
    "tests/agent_zero/test_agent_zero_client.py",
    "tests/warehouse/test_ingester.py",
    "tests/warehouse/test_ingester_replicas.py",
    "tests/deploy/test_bench_canary.py",
    "tests/bus/test_bus_cluster.py",
    "tests/observability/test_observability_report.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow files first (in the order above), every other file after them as collected;
    a file's tests stay together and in their order."""
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real nats-server with JetStream on a free loopback port, for the whole session."""
    from agentrl.bus.server import EmbeddedNats

    server = EmbeddedNats(data_dir=tmp_path_factory.mktemp("nats-session"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: object) -> str:
    return nats_server.url  # type: ignore[attr-defined, no-any-return]


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    """A fresh agentrl data dir for one test."""
    d = tmp_path / "agentrl-data"
    d.mkdir()
    return d
