"""Shared fixtures: one real embedded nats-server (JetStream) per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
