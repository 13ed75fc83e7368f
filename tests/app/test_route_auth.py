"""Issue 49.4: every route of every HTTP app agentrl builds needs credentials when they are
configured, except an explicit public list. `GET /v1/traces/stats` (control API) and
`GET /v1/episodes/stats` (gateway) once answered anyone; this walks each app's routes over
real HTTP (uvicorn, httpx) without a token, so a route added later without a check fails
here. A source scan makes sure no app or router is left out of the walk."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Route

import agentrl
from agentrl.app.api import ROUTERS, create_app
from agentrl.bus import Bus
from agentrl.bus.server import free_port
from agentrl.capture.service import CaptureService
from agentrl.capture.settings import CaptureSettings
from agentrl.core.httpserve import serve_http
from agentrl.core.settings import Settings
from agentrl.serving.gateway import GatewayState, create_gateway_app

# FastAPI's own documentation routes (the schema of the routes, no data) and, per app, the
# routes meant to answer without credentials: up/down and Prometheus metrics.
DOCS = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
PUBLIC = {
    "control API": DOCS | {"/health", "/metrics"},
    "gateway": DOCS | {"/health"},
}
# Where apps and routers are built. Adding one without adding it to the walk fails below.
APP_SOURCES = {
    "app/api.py": "control API",
    "serving/gateway.py": "gateway",
    "capture/service.py": "gateway",  # the episode routes, mounted by the gateway
    # a scripted OpenAI-compatible server for tests and benchmarks, never part of a stack
    "bench/testing_server.py": None,
    # the capture bench's stalled backend (answers nothing in time), never part of a stack
    "bench/capture.py": None,
}


def _router_sources() -> set[str]:
    return {name.removeprefix("agentrl.").replace(".", "/") + ".py" for name in ROUTERS}


def test_every_app_and_router_is_walked() -> None:
    src = Path(agentrl.__file__).parent
    pattern = re.compile(r"\b(FastAPI|Starlette|APIRouter)\(")
    found = {str(p.relative_to(src)) for p in src.rglob("*.py") if pattern.search(p.read_text())}
    known = set(APP_SOURCES) | _router_sources()
    assert found <= known, f"apps or routers not walked by this test: {sorted(found - known)}"


async def _serve(app: Any) -> AsyncIterator[str]:
    port = free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(serve_http(app, "127.0.0.1", port, stop, "test app"))
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as c:
        for _ in range(200):
            try:
                await c.get(f"{url}/health")
                break
            except httpx.TransportError:
                await asyncio.sleep(0.05)
    try:
        yield url
    finally:
        stop.set()
        await task


def routes_of(app: Any) -> list[tuple[str, set[str]]]:
    """(path, methods) of every route of `app`, those of included routers too (FastAPI
    0.165 keeps an included router as one lazy route that expands to its routes)."""
    out = []
    for route in app.routes:
        if hasattr(route, "effective_route_contexts"):
            out += [(c.path, set(c.methods or ())) for c in route.effective_route_contexts()]
        elif isinstance(route, Route):
            out.append((route.path, set(route.methods or {"GET"})))
    return out


async def _walk(app: Any, url: str, headers: dict[str, str]) -> dict[str, int]:
    """Each (method, path) of `app` called once with `headers`; path parameters filled in."""
    answers: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        for path, methods in routes_of(app):
            concrete = re.sub(r"\{[^}]+\}", "x1", path)
            for method in sorted(methods - {"HEAD", "OPTIONS"}):
                r = await c.request(method, concrete, headers=headers, json={})
                answers[f"{method} {path}"] = r.status_code
    return answers


def _open(answers: dict[str, int]) -> set[str]:
    return {k for k, code in answers.items() if code not in (401, 403)}


@pytest.fixture()
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    b = await Bus.connect(nats_url)
    await b.ensure_streams()
    yield b
    await b.close()


async def test_control_api_routes_need_a_token(bus: Bus, tmp_path: Path) -> None:
    tokens = {"t-alice": {"name": "alice", "scopes": ["*"]}}
    app = create_app(Settings(data_dir=tmp_path, api_tokens=tokens), bus)
    async for url in _serve(app):
        anon = await _walk(app, url, {})
        wrong = await _walk(app, url, {"Authorization": "Bearer nope"})
    paths = {k.split(" ", 1)[1] for k in anon}
    assert {"/v1/traces/stats", "/health", "/metrics"} <= paths  # the routers are mounted
    assert len(anon) >= 20, sorted(anon)
    for answers in (anon, wrong):
        opened = {k for k in _open(answers) if k.split(" ", 1)[1] not in PUBLIC["control API"]}
        assert not opened, f"answered without a token: {sorted(opened)}"
    assert anon["GET /v1/traces/stats"] == 401
    assert anon["GET /metrics"] == 200 and anon["GET /health"] == 200  # public, as meant
    assert PUBLIC["control API"] - DOCS <= paths  # the public list names real routes


async def test_gateway_routes_need_a_key(bus: Bus) -> None:
    state = GatewayState("p", api_keys=["gk"], capture=CaptureService(bus, CaptureSettings()))
    app = create_gateway_app(state)
    async for url in _serve(app):
        anon = await _walk(app, url, {})
        wrong = await _walk(app, url, {"Authorization": "Bearer nope"})
        async with httpx.AsyncClient(base_url=url) as c:  # with the key, it answers
            ok = await c.get("/v1/episodes/stats", headers={"Authorization": "Bearer gk"})
    paths = {k.split(" ", 1)[1] for k in anon}
    assert {"/v1/episodes/stats", "/v1/episodes/{episode_id}/end", "/v1/stats"} <= paths
    assert "POST /v1/chat/completions" in anon
    for answers in (anon, wrong):
        opened = {k for k in _open(answers) if k.split(" ", 1)[1] not in PUBLIC["gateway"]}
        assert not opened, f"answered without a key: {sorted(opened)}"
    assert anon["GET /v1/episodes/stats"] == 401 and anon["GET /health"] == 200
    assert ok.status_code == 200 and "open" in ok.json()
