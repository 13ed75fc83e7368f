"""The capture harness: a real nats-server (this package's own), the gateway serving a tiny
random model over HTTP with capture on, the control API over HTTP (/feedback, /v1/traces),
and the real reward service, all in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentrl.bus import Bus, EmbeddedNats

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}
VERSION = "p-base"
STREAMS = ("RL_TRAJECTORIES", "RL_REWARDS", "RL_FEEDBACK", "RL_COMPLETIONS", "RL_DLQ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def serve(app: Any) -> tuple[Any, asyncio.Task[None], int]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, port


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


@dataclass
class Harness:
    bus: Bus
    capture: Any
    gateway: str  # http://127.0.0.1:port (the OpenAI base URL is gateway + "/v1")
    api: str  # the control API
    stop: asyncio.Event
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    state: Any = None  # the gateway's GatewayState (versions, timeout)

    @property
    def base_url(self) -> str:
        return self.gateway + "/v1"

    async def trajectory(self, trajectory_id: str, timeout: float = 20.0) -> dict[str, Any]:
        """The published trajectory `trajectory_id` (read from RL_TRAJECTORIES)."""
        deadline = time.monotonic() + timeout
        while True:
            for doc in await stream_docs(self.bus, "RL_TRAJECTORIES"):
                if doc.get("trajectory_id") == trajectory_id:
                    return doc
            if time.monotonic() > deadline:
                raise AssertionError(f"trajectory {trajectory_id} was not published")
            await asyncio.sleep(0.1)

    async def trajectories(self) -> list[dict[str, Any]]:
        return await stream_docs(self.bus, "RL_TRAJECTORIES")

    async def reward_versions(
        self, trajectory_id: str, want: int, timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """The reward events of `trajectory_id` once `want` versions are there, by version."""
        deadline = time.monotonic() + timeout
        while True:
            mine = [
                d
                for d in await stream_docs(self.bus, "RL_REWARDS")
                if d.get("trajectory_id") == trajectory_id
            ]
            if len(mine) >= want:
                return sorted(mine, key=lambda d: d["metadata"]["version"])
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(mine)} reward versions of {trajectory_id}, not {want}")
            await asyncio.sleep(0.1)

    async def end(self, episode_id: str, **outcome: Any) -> dict[str, Any]:
        import httpx

        async with httpx.AsyncClient() as client:
            r = await client.post(f"{self.base_url}/episodes/{episode_id}/end", json=outcome)
        assert r.status_code == 200, r.text
        return dict(r.json())

    async def feedback(self, **body: Any) -> Any:
        import httpx

        async with httpx.AsyncClient() as client:
            return await client.post(f"{self.api}/feedback", json=body)


async def stream_docs(bus: Bus, stream: str) -> list[dict[str, Any]]:
    """Every message of `stream` (read by sequence, nothing consumed)."""
    info = await bus.js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        with contextlib.suppress(Exception):
            out.append(json.loads((await bus.js.get_msg(stream, seq)).data))
    return out


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
