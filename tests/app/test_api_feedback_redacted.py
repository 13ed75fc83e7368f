"""Issue 29.7: `POST /feedback` redacts comments and corrections (agentrl.rewards.redact)
before publishing, as the Agent Zero path does: no phone number or e-mail reaches
RL_FEEDBACK (and so the warehouse)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

from agentrl.app.api import create_app
from agentrl.bus import Bus
from agentrl.bus.server import free_port
from agentrl.core.httpserve import serve_http
from agentrl.core.settings import Settings

PII = "call me on +1 415 555 0134 or write to jane.doe@example.com"


async def test_feedback_comment_and_correction_are_redacted(nats_url: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, api_port=free_port())
    bus = await Bus.connect(nats_url, settings=settings)
    await bus.ensure_streams()
    got: list[dict[str, Any]] = []

    async def on(msg: Any) -> None:
        got.append(json.loads(msg.data))

    sub = await bus.nc.subscribe("agent.rl.feedback.v1", cb=on)
    stop = asyncio.Event()
    server = asyncio.create_task(
        serve_http(create_app(settings, bus), "127.0.0.1", settings.api_port, stop, "api")
    )
    url = f"http://127.0.0.1:{settings.api_port}"
    try:
        async with httpx.AsyncClient(base_url=url) as c:
            for _ in range(100):
                try:
                    await c.get("/health")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            r = await c.post(
                "/feedback",
                json={
                    "trajectory_id": "t-pii",
                    "type": "correction",
                    "comment": PII,
                    "correction": f"the right answer; {PII}",
                },
            )
            assert r.status_code == 202, r.text
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.05)
        assert got, "nothing published"
        event = got[-1]
        text = json.dumps(event)
        assert "jane.doe@example.com" not in text and "555 0134" not in text, text
        assert event["trajectory_id"] == "t-pii"
        assert event["correction"].startswith("the right answer")
    finally:
        stop.set()
        await server
        await sub.unsubscribe()
        await bus.close()
