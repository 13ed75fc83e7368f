"""Issue 29.12: with tokens configured, the gateway's `/v1/stats` needs one and `/health`
(gateway and control API) says only up/down without one; each token has a name, recorded
as `by` of deploy actions (tested in tests/release/test_rollout.py); an API beyond loopback
without tokens is refused unless AGENTRL_ALLOW_OPEN=1."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentrl.app.stack import stack_services
from agentrl.bus.server import free_port
from agentrl.core.apiauth import OpenBindRefused, check_exposure
from agentrl.core.httpserve import serve_http
from agentrl.core.settings import Settings
from agentrl.serving.gateway import GatewayState, create_gateway_app

TOKENS = {"t-alice": {"name": "alice", "scopes": ["deploy:read"]}}


async def _up(url: str) -> None:
    async with httpx.AsyncClient() as c:
        for _ in range(200):
            try:
                await c.get(url)
                return
            except httpx.TransportError:
                await asyncio.sleep(0.05)


async def test_control_api_health_is_up_down_without_a_token(nats_url: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, api_port=free_port(), api_tokens=TOKENS)
    async with stack_services(nats_url, settings, only={"control API"}) as stack:
        await _up(f"{stack.api_url}/health")
        async with httpx.AsyncClient(base_url=stack.api_url) as c:
            anon = (await c.get("/health")).json()
            bad = (await c.get("/health", headers={"Authorization": "Bearer nope"})).json()
            full = (await c.get("/health", headers={"Authorization": "Bearer t-alice"})).json()
    assert anon == {"ok": True} and bad == {"ok": True}
    assert full["services"]["control API"]["state"] == "running"


async def test_gateway_stats_need_a_key_and_health_is_up_down() -> None:
    state = GatewayState("p", api_keys=["gk"])
    port = free_port()
    stop = asyncio.Event()
    server = asyncio.create_task(
        serve_http(create_gateway_app(state), "127.0.0.1", port, stop, "gateway")
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await _up(f"{url}/health")
        async with httpx.AsyncClient(base_url=url) as c:
            assert (await c.get("/v1/stats")).status_code == 401
            ok = await c.get("/v1/stats", headers={"Authorization": "Bearer gk"})
            assert ok.status_code == 200 and "versions" in ok.json()
            assert (await c.get("/health")).json() == {"status": "ok"}
            keyed = await c.get("/health", headers={"Authorization": "Bearer gk"})
            assert "weights" in keyed.json()
    finally:
        stop.set()
        await server


def test_token_names_and_reserved_names() -> None:
    from agentrl.core.apiauth import token_name

    s = Settings(api_tokens={**TOKENS, "t-old": ["*"]})
    assert token_name(s, "t-alice") == "alice"
    assert token_name(s, "t-old").startswith("token-") and "t-old" not in token_name(s, "t-old")
    with pytest.raises(ValueError, match="agentrl-"):
        Settings(api_tokens={"x": {"name": "agentrl-deploy-controller", "scopes": ["*"]}})


def test_exposure_rules() -> None:
    check_exposure("127.0.0.1", False, "the control API", False)
    check_exposure("localhost", False, "the control API", False)
    check_exposure("::1", False, "the gateway", False)
    check_exposure("0.0.0.0", True, "the control API", False)  # tokens configured
    check_exposure("0.0.0.0", False, "the control API", True)  # AGENTRL_ALLOW_OPEN=1
    with pytest.raises(OpenBindRefused, match="AGENTRL_ALLOW_OPEN=1"):
        check_exposure("0.0.0.0", False, "the control API", False)
    with pytest.raises(OpenBindRefused, match="AGENTRL_DEPLOY_API_KEYS"):
        check_exposure("10.1.2.3", False, "the gateway", False)


def test_up_refuses_an_open_api_beyond_loopback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRL_", "NATS_"))}
    env |= {"AGENTRL_API_HOST": "0.0.0.0", "AGENTRL_API_PORT": str(free_port())}
    agentrl = str(Path(sys.executable).parent / "agentrl")
    res = subprocess.run(
        [agentrl, "up", "--data-dir", str(tmp_path / "d")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    out = " ".join((res.stdout + res.stderr).split())
    assert "refusing to serve the control API on 0.0.0.0" in out
    assert "AGENTRL_ALLOW_OPEN=1" in out
    assert "nats-server" not in out  # refused before anything started


async def test_control_api_service_refuses_an_open_bind(tmp_path: Path) -> None:
    from agentrl.app.api import serve

    settings = Settings(data_dir=tmp_path, api_host="0.0.0.0", api_port=free_port())
    with pytest.raises(OpenBindRefused):
        await serve(None, asyncio.Event(), settings)
