"""The soak's phase 0 (issue 29.4): the control API's port taken when the stack starts. Run
here on its own (the whole soak is minutes long): the API fails as a service, the rest keeps
serving, and the API serves once the port is free."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from agentrl.app.stack import stack_services
from agentrl.bench.soak import SoakResult, _api_port_taken, _take_port
from agentrl.bus.server import free_port
from agentrl.core.httpserve import serve_http
from agentrl.core.settings import Settings
from agentrl.serving.gateway import GatewayState, create_gateway_app


async def test_soak_phase_api_port_taken(nats_url: str, tmp_path: Path) -> None:
    api_port, gw_port = free_port(), free_port()
    squatter = _take_port(api_port)
    stop = asyncio.Event()
    gw = asyncio.create_task(
        serve_http(create_gateway_app(GatewayState("p")), "127.0.0.1", gw_port, stop, "gw")
    )
    result = SoakResult()
    lines: list[str] = []
    try:
        settings = Settings(data_dir=tmp_path, api_port=api_port)
        async with (
            stack_services(nats_url, settings, only={"control API"}) as stack,
            httpx.AsyncClient(timeout=5.0) as http,
        ):
            await _api_port_taken(
                squatter,
                stack,
                {},
                http,
                f"http://127.0.0.1:{api_port}",
                f"http://127.0.0.1:{gw_port}/v1",
                result,
                lines.append,
            )
    finally:
        squatter.close()
        stop.set()
        await gw
    assert result.checks and all(result.checks.values()), (result.checks, lines)
    assert result.recovery_s["control API after its port was freed"] is not None
