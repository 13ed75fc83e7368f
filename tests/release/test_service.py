"""`agentrl.release.service.serve` as `agentrl up` runs it: bootstraps the base model as the
live version, serves the gateway on the configured loopback port, consumes training statuses,
and stops cleanly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from agentrl.bus import Bus
from agentrl.core.settings import Settings
from deploy_helpers import free_port


async def test_serve_runs_gateway_and_controller(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrl.release.service import serve

    monkeypatch.setenv("AGENTRL_DEPLOY_BASE_MODEL", "tiny")
    monkeypatch.setenv("AGENTRL_DEPLOY_PUBLIC_MODEL", "svc-policy")
    monkeypatch.setenv("AGENTRL_DEPLOY_BUCKET", "svc_models")
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    settings = Settings(data_dir=tmp_path, gateway_port=free_port())
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, stop, settings))
    client = AsyncOpenAI(
        base_url=f"http://127.0.0.1:{settings.gateway_port}/v1", api_key="x", max_retries=0
    )
    try:
        for _ in range(200):
            try:
                models = [m.id async for m in client.models.list()]
                if "svc-policy-base" in models:
                    break
            except Exception:  # not up yet
                pass
            await asyncio.sleep(0.1)
        assert models[:2] == ["svc-policy", "svc-policy-base"]
        resp = await client.chat.completions.create(
            model="svc-policy", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
        )
        assert resp.model == "svc-policy-base" and resp.usage.completion_tokens == 3
    finally:
        await client.close()
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()
