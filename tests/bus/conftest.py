"""The bus tests' client: on the session's nats-server, every stream empty at the start."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentrl.bus import Bus
from agentrl.contracts import STREAMS


@pytest.fixture()
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_url)
    await b.ensure_streams()
    for spec in STREAMS:
        await b.js.purge_stream(spec.name)
    yield b
    await b.ensure_streams()  # a test may delete a stream (RL_DLQ)
    await b.close()
