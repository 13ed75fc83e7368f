"""The stack supervisor: a dying service is restarted with backoff and its failure is visible;
the control API's /health reports every service; stopping waits for all of them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from agentrl.app.stack import ServiceHealth, stack_services, supervise
from agentrl.bus.server import free_port
from agentrl.core.settings import Settings


async def test_a_crashing_service_is_restarted_and_its_error_kept() -> None:
    calls = 0
    stop = asyncio.Event()

    async def flaky(bus: object, stop: asyncio.Event, settings: object) -> None:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError(f"boom {calls}")
        await stop.wait()

    health = ServiceHealth("flaky")
    task = asyncio.create_task(
        supervise("flaky", flaky, None, stop, Settings(), health, backoff=(0.01, 0.02))  # type: ignore[arg-type]
    )
    for _ in range(200):
        if calls >= 3 and health.state == "running":
            break
        await asyncio.sleep(0.01)
    assert calls == 3 and health.restarts == 2 and health.healthy
    assert health.last_error == "RuntimeError: boom 2"
    stop.set()
    await asyncio.wait_for(task, 2)
    assert health.state == "stopped"


async def test_a_service_that_keeps_dying_is_marked_failed() -> None:
    async def dead(bus: object, stop: asyncio.Event, settings: object) -> None:
        raise ValueError("bad config")

    health = ServiceHealth("dead")
    await asyncio.wait_for(
        supervise(
            "dead", dead, None, asyncio.Event(), Settings(), health, backoff=(0.0,), max_restarts=3
        ),  # type: ignore[arg-type]
        2,
    )
    assert health.state == "failed" and health.restarts == 4
    assert "bad config" in (health.last_error or "")


async def test_health_endpoint_reports_the_running_services(nats_url: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, api_port=free_port())
    async with stack_services(nats_url, settings, only={"control API"}) as stack:
        async with httpx.AsyncClient() as client:
            for _ in range(100):
                try:
                    resp = await client.get(f"{stack.api_url}/health")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
        body = resp.json()
        assert resp.status_code == 200 and body["ok"] is True
        assert body["services"]["control API"]["state"] == "running"
    assert stack.health["control API"].state == "stopped"
