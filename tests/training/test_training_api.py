"""The /training, /models and /feedback routes: auth (401/403), 422s that name the field,
Idempotency-Key, and a schemathesis run against the served OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from training_helpers import settings_for

from agentrl.bus import Bus
from agentrl.bus.server import free_port
from agentrl.core.settings import Settings

TOKENS = {
    "writer": ["training:write", "training:read", "feedback:write"],
    "reader": ["training:read"],
}


def training_app(settings: Settings, bus: Any) -> Any:
    """Only this package's router (other packages' routes are not ours to fuzz)."""
    from fastapi import FastAPI

    from agentrl.training.api import router

    app = FastAPI(title="agentrl training API", version="1")
    app.state.bus, app.state.settings = bus, settings
    app.include_router(router)
    return app


@pytest.fixture()
def api(nats, data_dir) -> Iterator[tuple[str, Settings]]:
    """The router served by uvicorn over real HTTP, with its own event loop and bus."""
    yield from serve_api(nats, data_dir)


def serve_api(nats, data_dir, **bus_kw: Any) -> Iterator[tuple[str, Settings]]:
    """Serve the router until the generator is closed (`bus_kw`: the API's bus options)."""
    import uvicorn

    settings = settings_for(data_dir, nats.url).model_copy(update={"api_tokens": TOKENS})
    port = free_port()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        async def main() -> None:
            bus = await Bus.connect(nats.url, settings=settings, **bus_kw)
            await bus.ensure_streams()
            config = uvicorn.Config(
                training_app(settings, bus), host="127.0.0.1", port=port, log_level="warning"
            )
            server = uvicorn.Server(config)
            box["server"] = server
            task = asyncio.create_task(server.serve())
            while not server.started:
                await asyncio.sleep(0.02)
            ready.set()
            await task
            await bus.close()

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30), "API did not start"
    yield f"http://127.0.0.1:{port}", settings
    box["server"].should_exit = True
    thread.join(15)


W = {"Authorization": "Bearer writer"}
R = {"Authorization": "Bearer reader"}


def test_auth_401_and_403(api):
    url, _ = api
    with httpx.Client(base_url=url) as c:
        assert c.get("/training").status_code == 401
        assert c.get("/training", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.get("/training", headers=R).status_code == 200
        r = c.post("/training/start", json={}, headers=R)
        assert r.status_code == 403 and "training:write" in r.json()["detail"]
        assert c.post("/feedback", json={}, headers=R).status_code == 403
        assert c.get("/openapi.json").status_code == 200


def test_422_names_the_field(api):
    url, _ = api
    with httpx.Client(base_url=url, headers=W) as c:
        r = c.post("/training/start", json={"priority": "someday"})
        assert r.status_code == 422
        locs = [tuple(e["loc"]) for e in r.json()["detail"]]
        assert ("body", "priority") in locs
        r = c.post(
            "/training/start", json={"training_config": {"hyperparameters": {"learning_rate": -1}}}
        )
        assert r.status_code == 422
        assert ("body", "training_config", "hyperparameters", "learning_rate") in [
            tuple(e["loc"]) for e in r.json()["detail"]
        ]
        r = c.post("/feedback", json={"trajectory_id": "t", "type": "rating"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rating"]
        r = c.post("/feedback", json={"trajectory_id": "t", "type": "thumbs_sideways"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "type"]
        assert c.get("/training", params={"status": "sleeping"}).status_code == 422
        assert c.get("/training/unknown-job/status").status_code == 404
        assert c.post("/training/unknown-job/cancel").status_code == 404


async def test_idempotency_key_and_published_request(api, nats, data_dir):
    url, _ = api
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    got: list[dict[str, Any]] = []

    async def on(msg: Any) -> None:
        got.append(json.loads(msg.data))

    await bus.nc.subscribe("agent.rl.training.request.v1", cb=on)
    await bus.nc.subscribe("agent.rl.feedback.v1", cb=on)
    body = {"training_config": {"algorithm": "grpo", "base_model": "tiny"}, "priority": "high"}
    try:
        async with httpx.AsyncClient(base_url=url, headers=W) as c:
            a = await c.post("/training/start", json=body, headers={"Idempotency-Key": "k1"})
            b = await c.post("/training/start", json=body, headers={"Idempotency-Key": "k1"})
            assert a.status_code == b.status_code == 202
            assert a.json()["training_job_id"] == b.json()["training_job_id"]
            assert b.json()["idempotent_replay"] is True
            other = {**body, "priority": "low"}
            conflict = await c.post(
                "/training/start", json=other, headers={"Idempotency-Key": "k1"}
            )
            assert conflict.status_code == 409
            fresh = await c.post("/training/start", json=body)
            assert fresh.json()["training_job_id"] != a.json()["training_job_id"]
            fb = await c.post(
                "/feedback",
                json={
                    "trajectory_id": "t-1",
                    "type": "correction",
                    "correction": "the right answer",
                },
            )
            assert fb.status_code == 202
        for _ in range(50):
            if len(got) >= 3:
                break
            await asyncio.sleep(0.05)
        requests = [g for g in got if "training_config" in g]
        # A replay with no status yet publishes the stored request again under the same
        # Msg-Id: subscribers may see it twice, the stream stores it once.
        assert len({r["training_job_id"] for r in requests}) == 2, "the replay made no new job"
        assert (await bus.js.stream_info("RL_TRAINING")).state.messages == 2
        full = requests[0]
        assert full["trigger_reason"] == "manual" and full["priority"] == "high"
        assert full["training_config"]["dataset"]["stream_name"] == "RL_TRAJECTORIES"
        assert "evaluation" in full and "hyperparameters" in full["training_config"]
        assert any(g.get("type") == "correction" for g in got)
    finally:
        await bus.close()


def test_schemathesis_finds_no_server_errors(api):
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    url, _ = api
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    ran = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = operation.as_strategy()

        @settings(
            max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=strategy)
        def check(case: Any) -> None:
            case.headers = {**(case.headers or {}), **W}
            response = case.call(base_url=url, timeout=30)
            case.validate_response(response, checks=[not_a_server_error])

        check()
        ran += 1
    assert ran == 6
    # Hostile ids and checkpoint paths, as schemathesis cases of the same operations.
    start = schema["/training/start"]["POST"]
    hostile = [
        {"training_job_id": bad} for bad in ("../../..", "/tmp/agentrl-x", "a/b", "x" * 65, "\x00")
    ] + [
        {"training_config": {"checkpointing": {"storage_path": bad}}}
        for bad in ("/tmp/agentrl-x", "../../..", "file:///etc", "s3://other/x", "./a/../../..")
    ]
    for body in hostile:
        case = start.Case(body=body, headers=W, media_type="application/json")
        response = case.call(base_url=url, timeout=30)
        case.validate_response(response, checks=[not_a_server_error])
        assert response.status_code == 422, (body, response.text)
    status_op = schema["/training/{job_id}/status"]["GET"]
    for bad in ("..", "../../etc/passwd", "%2e%2e", "a" * 300):
        case = status_op.Case(path_parameters={"job_id": bad}, headers=W)
        response = case.call(base_url=url, timeout=30)
        case.validate_response(response, checks=[not_a_server_error])
        assert response.status_code in (404, 422), (bad, response.text)
