"""Issue 54: `agentrl up` starts the gateway (and the control API) first; the other services
start once the gateway serves. On 2 cores their start-up (imports of pandas and chdb, the
stores) took the CPU the model's load needed, and the first token came later.

Real parts: the stack's own supervisor and readiness probe, a real HTTP server as the
"deployment controller" that needs a while before it listens, real NATS."""

from __future__ import annotations

import asyncio
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.app import stack
from agentrl.bus.server import free_port
from agentrl.core.httpserve import serve_http
from agentrl.core.settings import Settings

EVENTS: list[tuple[str, float]] = []


async def hello(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


async def slow_gateway(bus: object, stop: asyncio.Event, settings: Settings) -> None:
    await asyncio.sleep(float(getattr(settings, "_load_s", 1.5)))  # "loading the model"
    EVENTS.append(("gateway listens", time.monotonic()))
    await serve_http(hello, "127.0.0.1", settings.gateway_port, stop, "gateway")


async def never_serves(bus: object, stop: asyncio.Event, settings: Settings) -> None:
    await stop.wait()


async def other(bus: object, stop: asyncio.Event, settings: Settings) -> None:
    EVENTS.append(("other starts", time.monotonic()))
    await stop.wait()


@pytest.fixture()
def services(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    mod = types.ModuleType("gwfirst_services")
    mod.slow_gateway, mod.never_serves, mod.other = slow_gateway, never_serves, other  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gwfirst_services", mod)
    EVENTS.clear()
    yield


def _settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, api_port=free_port(), gateway_port=free_port())


async def test_the_other_services_start_once_the_gateway_serves(
    services: None, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        stack,
        "SERVICES",
        (
            ("reward service", "gwfirst_services:other"),
            ("deployment controller", "gwfirst_services:slow_gateway"),
        ),
    )
    async with stack.stack_services(nats_url, _settings(tmp_path)) as running:
        await asyncio.sleep(0.5)
        reward = running.health["reward service"]
        assert reward.state == "starting" and reward.waiting_for == stack.AFTER_GATEWAY
        assert [e for e, _ in EVENTS] == []  # nothing but the gateway's load so far
        for _ in range(300):
            if reward.state == "running":
                break
            await asyncio.sleep(0.05)
        assert reward.state == "running" and reward.waiting_for is None
        assert running.health["deployment controller"].state == "running"
    names = [e for e, _ in EVENTS]
    assert names == ["gateway listens", "other starts"], EVENTS


async def test_they_start_anyway_when_the_gateway_takes_too_long(
    services: None, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        stack,
        "SERVICES",
        (
            ("reward service", "gwfirst_services:other"),
            ("deployment controller", "gwfirst_services:never_serves"),
        ),
    )
    t = time.monotonic()
    async with stack.stack_services(nats_url, _settings(tmp_path), gateway_first_s=1.0) as s:
        for _ in range(200):
            if s.health["reward service"].state == "running":
                break
            await asyncio.sleep(0.05)
        assert s.health["reward service"].state == "running"
        assert s.health["deployment controller"].state == "starting"
    started = dict(EVENTS)["other starts"] - t
    assert 0.9 <= started < 5, started


async def test_without_a_gateway_every_service_starts_at_once(
    services: None, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack, "SERVICES", (("reward service", "gwfirst_services:other"),))
    async with stack.stack_services(nats_url, _settings(tmp_path)) as s:
        for _ in range(100):
            if EVENTS:
                break
            await asyncio.sleep(0.02)
        assert s.health["reward service"].state == "running"
    assert [e for e, _ in EVENTS] == ["other starts"]
