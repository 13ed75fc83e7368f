"""Fixtures of the deploy tests: LoRA checkpoints written by agentrl.llm.checkpoint over a
tiny random base, and one shared local engine (base + adapters)."""

from __future__ import annotations

from typing import Any

import pytest

from deploy_helpers import TINY, write_checkpoint


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "plan(rollout_plan): the rollout plan of the harness")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("ckpts")
    return [write_checkpoint(root / f"job{i}", seed=i + 1) for i in range(3)]


@pytest.fixture(scope="session")
def engine() -> Any:
    from agentrl.serving.local import LocalEngine

    return LocalEngine(
        "tiny", seed=0, tiny_kwargs=TINY, max_batch_size=8, max_wait_ms=5.0, default_max_tokens=16
    )
