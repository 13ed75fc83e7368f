"""What the capture tests share besides their fixtures (`conftest.py`): the harness's
handle, a free port, serving an app in the test's loop, reading a stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.bus import Bus

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
