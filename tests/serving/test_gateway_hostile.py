"""A hostile caller cannot decide a canary (issue 49.1): over a real served gateway, a real
controller and a real nats-server, through the official openai SDK, requests whose
`response_format` schema is nested 500 levels deep (a RecursionError in the schema hashing
once, each a 502 counted as the version's server error with a full traceback) are 400s that
count nowhere; requests naming a version by its id are counted apart from the canary's
evidence; and the canary, as good as live, is not rolled back."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from agentrl.bus import Bus
from agentrl.contracts.base import utcnow
from agentrl.contracts.reward import RewardEvent
from agentrl.core.settings import Settings
from agentrl.release.service import build
from agentrl.serving.config import Analysis, DeploySettings, RolloutPlan, Step
from agentrl.serving.gateway import VERSION_HEADER, create_gateway_app
from deploy_helpers import free_port

MSG = [{"role": "user", "content": "hi"}]


def deep_body(model: str, levels: int = 495) -> bytes:
    """A chat request whose response_format schema nests `levels` objects (written out by
    hand: Python's own json module cannot encode it, the gateway's orjson can read it)."""
    schema = '{"type":"object","properties":{"a":' * levels
    schema += '{"type":"string"}' + '},"required":["a"]}' * levels
    return (
        f'{{"model":"{model}","max_tokens":2,"messages":[{{"role":"user","content":"hi"}}],'
        f'"response_format":{{"type":"json_schema","json_schema":{{"name":"deep",'
        f'"schema":{schema}}}}}}}'
    ).encode()


@pytest.fixture()
async def rollout(nats_url: str, engine: Any, tmp_path: Path, checkpoints: list[str]):
    """A canary (10 %) of a real checkpoint over the tiny base, live the base; the monitor
    ticks every 0.3 s with min_samples 10 and a 5-point error-rate tolerance."""
    import uvicorn

    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    tag = uuid.uuid4().hex[:8]
    the_plan = RolloutPlan(
        strategy="canary",
        steps=[Step(weight=w, pause_s=600.0) for w in (10, 50, 100)],
        analysis=Analysis(
            period_s=0.3,
            min_samples=10,
            reward_range=(0.0, 1.0),
            max_reward_drop=1.0,
            max_error_increase=0.05,
        ),
    )
    settings = Settings(data_dir=tmp_path, gateway_port=free_port())
    deploy = DeploySettings(public_model=f"pol-{tag}", bucket=f"models_{tag}", monitor_period_s=0.3)
    d = await build(bus, settings, deploy, engine=engine, validate=None, plan=the_plan)
    await d.deployer.bootstrap("tiny")
    await d.manager.sync(force=True)
    from agentrl.release.actions import checkpoint_sha

    record = await d.deployer.register(
        checkpoint_path=checkpoints[0],
        base_model="tiny",
        sha256=checkpoint_sha(checkpoints[0], d.manager.cache_dir),
        training_job_id=str(uuid.uuid4()),
    )
    stop = asyncio.Event()
    server = uvicorn.Server(
        uvicorn.Config(
            create_gateway_app(d.state),
            host="127.0.0.1",
            port=settings.gateway_port,
            log_level="warning",
            lifespan="off",
        )
    )
    tasks = [
        asyncio.create_task(x)
        for x in (
            d.manager.run(stop, poll_s=0.05),
            d.controller.run(stop),
            d.tracker.run(bus, stop),
            server.serve(),
        )
    ]
    while not server.started:
        await asyncio.sleep(0.01)
    await d.deployer.start(record.model_id, the_plan, by="test")
    for _ in range(200):  # the gateway serves the canary
        if record.model_id in d.state.weights:
            break
        await asyncio.sleep(0.05)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{settings.gateway_port}/v1", api_key="k", max_retries=0
    )
    try:
        yield d, bus, client, record.model_id, f"{deploy.public_model}-base"
    finally:
        await client.close()
        stop.set()
        server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()


async def _rewards(bus: Bus, model: str, n: int, value: float) -> None:
    await bus.publish_many(
        [
            RewardEvent.model_validate(
                {
                    "trajectory_id": str(uuid.uuid4()),
                    "session_id": str(uuid.uuid4()),
                    "timestamp": utcnow().isoformat(),
                    "reward_components": {"task_completion": {"score": value, "weight": 1.0}},
                    "total_reward": value,
                    "metadata": {"model": model},
                }
            )
            for _ in range(n)
        ]
    )


async def test_deep_schemas_naming_the_canary_cannot_roll_it_back(
    rollout: Any, caplog: pytest.LogCaptureFixture
) -> None:
    d, bus, client, canary, live = rollout
    assert d.state.weights.get(canary) == 10.0
    before = {v: d.state.stats_for(v).snapshot() for v in (canary, live)}
    caplog.set_level(logging.INFO, logger="agentrl.serving.gateway")
    sem = asyncio.Semaphore(8)

    async def hostile(i: int, model: str) -> int:
        async with sem:
            try:  # the official SDK, sending the body as written (its json cannot)
                await client.post(
                    "/chat/completions",
                    cast_to=ChatCompletion,
                    content=deep_body(model),
                    options={"headers": {"content-type": "application/json"}},
                )
            except openai.BadRequestError as exc:
                assert "nested deeper" in exc.message, exc.message
                return exc.status_code
            return 200

    # forty naming the canary by its id, forty more through the public name (any version)
    codes = await asyncio.gather(*(hostile(i, canary) for i in range(40)))
    codes += await asyncio.gather(*(hostile(i, d.settings.public_model) for i in range(40)))
    assert codes == [400] * 80
    for v in (canary, live):  # the evidence did not move: no request, no error
        now = d.state.stats_for(v).snapshot()
        assert (now["requests"], now["errors"]) == (before[v]["requests"], before[v]["errors"])
    assert d.state.refused == 80
    assert d.state.stats_for(canary, pinned=True).errors == 0
    # logged as short lines, never a traceback per request
    mine = [r for r in caplog.records if r.name == "agentrl.serving.gateway"]
    assert all(r.exc_info is None for r in mine) and len(mine) <= 2, [r.message for r in mine]

    # the canary is as good as live: ordinary traffic and equal rewards; the monitor
    # looks many times and never rolls it back on the hostile requests
    for round_ in range(6):
        for i in range(40):
            raw = await client.chat.completions.with_raw_response.create(
                model=d.settings.public_model, messages=MSG, max_tokens=1, user=f"r{round_}-{i}"
            )
            assert raw.headers[VERSION_HEADER] in (canary, live)
        await _rewards(bus, canary, 5, 0.6)
        await _rewards(bus, live, 5, 0.6)
        await asyncio.sleep(0.4)
    record = await d.registry.require_model(canary)
    assert record.state != "rolled_back", record.decisions[-1]
    assert not [x for x in record.decisions if x.action == "rollback"]
    assert d.state.stats_for(canary).errors == 0 and d.state.stats_for(live).errors == 0
    assert d.state.stats_for(canary).requests > 0 and d.state.stats_for(live).requests >= 10


async def test_pinned_requests_are_counted_apart(rollout: Any) -> None:
    """A version named by its id is served (and its failures seen in /v1/stats), but it is
    not the split's evidence: a caller cannot inflate either side's counters by pinning."""
    d, _, client, canary, live = rollout
    before = {v: d.state.stats_for(v).requests for v in (canary, live)}
    for v in (canary, live):
        out = await client.chat.completions.create(model=v, messages=MSG, max_tokens=1)
        assert out.model == v
    assert {v: d.state.stats_for(v).requests for v in (canary, live)} == before
    assert d.state.pinned[canary].requests == 1 and d.state.pinned[live].requests == 1
    async with httpx.AsyncClient(base_url=str(client.base_url)) as h:  # shown apart
        shown = (await h.get("/stats")).json()
    assert shown["pinned"][canary]["requests"] == 1 and shown["compiles"]["busy"] == 0
