"""Every observability test starts with empty label caps: earlier tests in the same process
(the gateway, the deployer) may have used up a cap's values, after which a new version is
counted as "other" — correct in production, but not what these tests look at."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def fresh_label_caps() -> Iterator[None]:
    from agentrl.observability import instrument, metrics

    for cap in vars(metrics).values():
        if isinstance(cap, metrics.LabelCap | metrics.VersionLabels):
            cap.reset()
    instrument._clear_children()
    yield
