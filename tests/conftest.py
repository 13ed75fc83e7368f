"""Shared fixtures: one real embedded nats-server (JetStream) per test session, SmolLM2's
tokenizer."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

# the tiny engine and checkpoints of the serving, release and bench tests
pytest_plugins = ["deploy_fixtures", "cpu_report"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The file whose one test is the longest (the tool-use quick loop, 1-1.5 minutes): handed out
# first, beside the other worker's largest file, instead of last (xdist gives out files by
# their number of tests, most first, and a one-test file at the end kept the other worker idle)
FIRST = ("tests/app/test_loop_tooluse.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files in xdist's own order (most tests first, `scripts/test.sh` passes
    `--no-loadscope-reorder`), except `FIRST` at the front."""

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    count = Counter(file_of(item) for item in items)

    def rank(item: pytest.Item) -> tuple[int, int]:
        return (0 if file_of(item) in FIRST else 1, -count[file_of(item)])

    items.sort(key=rank)  # stable: the tests of a file keep their order


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


@pytest.fixture()
def fresh_label_caps() -> Iterator[None]:
    """Empty metric label caps: earlier tests in the same process (the gateway, the deployer,
    other lineages) may have used up a cap's values, after which a new version or lineage is
    counted as "other" — correct in production, not what a test of the labels looks at."""
    from agentrl.observability import instrument, metrics

    for cap in vars(metrics).values():
        if isinstance(cap, metrics.LabelCap | metrics.VersionLabels):
            cap.reset()
    metrics._lineage_of.clear()
    instrument._clear_children()
    was_on = metrics.enabled()
    metrics.set_enabled(True)
    yield
    metrics.set_enabled(was_on)


@pytest.fixture(scope="session")
def smol_tokenizer():  # type: ignore[no-untyped-def]
    """SmolLM2's tokenizer (from the packaged GGUF; seconds, no network): the llm, learners,
    app and training tests' prompts and tokens."""
    from agentrl.llm.loading import load_smollm2_tokenizer

    return load_smollm2_tokenizer()
