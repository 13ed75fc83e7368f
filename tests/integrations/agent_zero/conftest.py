"""Fixtures: an Agent Zero-shaped checkout with the plugin installed, a nats-server of our
own (the spool test stops and starts one on a fixed port). What the tests share besides
fixtures is in `a0_kit.py`: a conftest imported by name clashes with tests/capture's."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

from a0_kit import Checkout
from a0_standins import install_standins, make_checkout, remove_standins

from agentrl.bus.server import EmbeddedNats
from agentrl.integrations.agent_zero import state


@pytest.fixture(scope="module")
def a0_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(data_dir=tmp_path_factory.mktemp("a0-nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def checkout(tmp_path: Path, a0_nats: EmbeddedNats) -> Iterator[Checkout]:
    root = make_checkout(tmp_path / "agent-zero")
    install_standins(root)
    try:
        yield Checkout(root, a0_nats.url, publish_timeout_s=5.0)
    finally:
        remove_standins(root)
        state.reset_caches()
