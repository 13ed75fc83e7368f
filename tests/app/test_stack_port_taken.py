"""Issue 29.4: the control API's port taken at start is an ordinary service failure. uvicorn
exits (SystemExit) when it cannot bind; that must not end `agentrl up` — the supervisor
restarts the API with backoff, shows the error, and it serves once the port is free."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx

from agentrl.app.stack import ServiceHealth, stack_services, supervise
from agentrl.bus.server import free_port
from agentrl.core.settings import Settings


def _hold(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(1)
    return sock


async def test_control_api_port_taken_is_a_restartable_failure(
    nats_url: str, tmp_path: Path
) -> None:
    port = free_port()
    holder = _hold(port)
    beats = 0
    stop_other = asyncio.Event()

    async def other(bus: object, stop: asyncio.Event, settings: object) -> None:
        nonlocal beats
        while not stop.is_set():
            beats += 1
            await asyncio.sleep(0.05)

    other_health = ServiceHealth("other")
    other_task = asyncio.create_task(
        supervise("other", other, None, stop_other, Settings(), other_health)  # type: ignore[arg-type]
    )
    settings = Settings(data_dir=tmp_path, api_port=port)
    try:
        async with stack_services(nats_url, settings, only={"control API"}) as stack:
            api = stack.health["control API"]
            for _ in range(200):
                if api.restarts >= 1:
                    break
                await asyncio.sleep(0.05)
            assert api.restarts >= 1, api
            assert api.state in ("restarting", "running")
            assert "could not listen" in (api.last_error or ""), api.last_error
            assert str(port) in (api.last_error or "")
            from rich.console import Console

            from agentrl.app.status_panel import render

            console = Console(record=True, width=250)
            console.print(await render(stack, 0.0))  # the panel shows the failing service
            shown = console.export_text()
            assert "control API" in shown and "could not listen" in shown, shown
            before = beats
            await asyncio.sleep(0.3)
            assert beats > before and other_health.healthy  # the rest keeps running
            holder.close()
            async with httpx.AsyncClient() as client:
                resp = None
                for _ in range(300):  # the backoff (1 s, 2 s, ...) brings it back
                    try:
                        resp = await client.get(f"{stack.api_url}/health")
                        break
                    except httpx.TransportError:
                        await asyncio.sleep(0.05)
            assert resp is not None and resp.status_code == 200
            assert stack.health["control API"].state == "running"
    finally:
        holder.close()
        stop_other.set()
        await asyncio.wait_for(other_task, 5)
