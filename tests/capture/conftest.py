"""The capture harness: a real nats-server (this package's own), the gateway serving a tiny
random model over HTTP with capture on, the control API over HTTP (/feedback, /v1/traces),
and the real reward service, all in the test's event loop. What the tests import is in
`capture_kit.py` (a conftest imported by name clashes with another folder's)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from capture_kit import STREAMS, TINY, VERSION, Harness, serve

from agentrl.bus import Bus, EmbeddedNats


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    srv = EmbeddedNats(data_dir=tmp_path_factory.mktemp("capture-nats"))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def engine() -> Any:
    from agentrl.serving.local import LocalEngine

    return LocalEngine(
        "tiny", seed=0, tiny_kwargs=TINY, max_batch_size=8, max_wait_ms=2.0, default_max_tokens=8
    )


@pytest.fixture()
async def harness(
    server: EmbeddedNats, engine: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Harness]:
    from agentrl.app.api import create_app
    from agentrl.capture.service import CaptureService
    from agentrl.capture.settings import CaptureSettings
    from agentrl.core.settings import Settings
    from agentrl.rewards.service import RewardService
    from agentrl.serving.backends import LocalBackend
    from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app

    marker = request.node.get_closest_marker("capture")
    overrides = dict(marker.kwargs) if marker else {}
    bus = await Bus.connect(server.url, name="capture-test")
    await bus.ensure_streams()
    for name in STREAMS:
        await bus.js.purge_stream(name)
    stop = asyncio.Event()
    capture = CaptureService(bus, CaptureSettings(**overrides))
    log = CompletionLog(bus, linger_s=0.01)
    state = GatewayState("agentrl-policy", completion_log=log, capture=capture)
    state.backends[VERSION] = LocalBackend(engine, tmp_path)
    state.set_split({VERSION: 1.0}, [VERSION])
    gw, gw_task, gw_port = await serve(create_gateway_app(state))
    settings = Settings(data_dir=tmp_path / "data")
    api, api_task, api_port = await serve(create_app(settings, bus))
    rewards = RewardService(bus, None, tmp_path / "rewards", durable=f"cap-{uuid.uuid4().hex[:8]}")
    h = Harness(bus, capture, f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{api_port}", stop)
    h.state = state
    h.tasks = [
        asyncio.create_task(capture.run(stop, tick_s=0.2)),
        asyncio.create_task(log.run(stop)),
        asyncio.create_task(rewards.run(stop)),
        gw_task,
        api_task,
    ]
    try:
        yield h
    finally:
        stop.set()
        gw.should_exit = True
        api.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*h.tasks, return_exceptions=True), 30)
        await asyncio.wait_for(bus.close(), 10)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "capture(**settings): CaptureSettings of the harness")
