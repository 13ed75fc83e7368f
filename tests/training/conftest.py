"""Fixtures of the training tests: a fresh real nats-server per test (stream contents never
leak between tests) and the SmolLM2 tokenizer (chat template)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.bus import EmbeddedNats


@pytest.fixture()
def nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(data_dir=tmp_path / "nats-data")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from agentrl.llm.loading import load_smollm2_tokenizer

    return load_smollm2_tokenizer()
