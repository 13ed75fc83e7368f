"""Rollouts end to end on a real nats-server, the gateway on real HTTP: a good version is
promoted through every step, an always-failing one and a lower-reward one are rolled back by
the monitor, a bad checksum never serves, manual pause / rollback / weight go through the
control API and the CLI, and a restarted gateway keeps the split."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl.bench.bus import sample_trajectory
from agentrl.bench.testing_server import ScriptedOpenAIServer, ScriptedReply
from agentrl.bus import Bus
from agentrl.contracts.base import utcnow
from agentrl.contracts.reward import RewardEvent
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.core.settings import Settings
from agentrl.release.service import Deployment, build
from agentrl.serving.config import Analysis, DeploySettings, RolloutPlan, Step
from agentrl.serving.gateway import VERSION_HEADER, create_gateway_app
from agentrl.serving.openai_types import ChatRequest
from deploy_helpers import free_port


class Harness:
    def __init__(self, d: Deployment, bus: Bus, port: int) -> None:
        self.d, self.bus, self.port = d, bus, port
        self.public = d.settings.public_model
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"

    async def traffic(self, n: int, concurrency: int = 16, prefix: str = "s") -> dict[str, int]:
        """n requests from n sessions; returns how many each version served (and errors)."""
        served: dict[str, int] = {}
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=30) as client:

            async def one(i: int) -> None:
                async with sem:
                    r = await client.post(
                        self.url,
                        json={
                            "model": self.public,
                            "user": f"{prefix}-{i}",
                            "max_tokens": 1,
                            "messages": [{"role": "user", "content": "hi"}],
                        },
                    )
                    v = r.headers.get(VERSION_HEADER, "none")
                    key = v if r.status_code == 200 else f"error:{v}"
                    served[key] = served.get(key, 0) + 1

            await asyncio.gather(*(one(i) for i in range(n)))
        return served

    async def rewards(self, model: str, values: list[float], via_trajectory: bool = False) -> None:
        events = []
        for v in values:
            tid = str(uuid.uuid4())
            meta: dict[str, Any] = {} if via_trajectory else {"model": model}
            events.append(
                RewardEvent.model_validate(
                    {
                        "trajectory_id": tid,
                        "session_id": str(uuid.uuid4()),
                        "timestamp": utcnow().isoformat(),
                        "reward_components": {"task_completion": {"score": v, "weight": 1.0}},
                        "total_reward": v,
                        "metadata": meta,
                    }
                )
            )
            if via_trajectory:
                traj = sample_trajectory(0, turns=1).model_dump(mode="json")
                traj.update(trajectory_id=tid, metadata={"model": model})
                events.append(TrajectoryEvent.model_validate(traj))
        await self.bus.publish_many(events)

    async def events(self) -> list[dict[str, Any]]:
        out = []
        info = await self.bus.js.stream_info("RL_MODELS")
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await self.bus.js.get_msg("RL_MODELS", seq)
            if msg.subject != "agent.rl.model.deployed.v1":
                continue
            data = json.loads(msg.data)
            if data["metadata"].get("public_model") == self.public:
                out.append(data)
        return out

    async def wait_for(self, predicate: Any, timeout: float) -> float:
        start = time.time()
        while time.time() - start < timeout:
            if await predicate():
                return time.time() - start
            await asyncio.sleep(0.05)
        raise AssertionError(f"condition not met within {timeout}s")


def plan(
    pause: float,
    period: float = 0.3,
    min_samples: int = 10,
    max_reward_drop: float = 0.1,
    max_error_increase: float = 0.05,
) -> RolloutPlan:
    return RolloutPlan(
        strategy="canary",
        steps=[Step(weight=w, pause_s=pause) for w in (10, 25, 50, 100)],
        analysis=Analysis(
            period_s=period,
            min_samples=min_samples,
            reward_range=(0.0, 1.0),
            max_reward_drop=max_reward_drop,
            max_error_increase=max_error_increase,
        ),
    )


@pytest.fixture()
async def harness(nats_url: str, engine: Any, tmp_path: Path, request: pytest.FixtureRequest):
    marker = request.node.get_closest_marker("plan")
    the_plan = marker.args[0] if marker else plan(0.3)
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    tag = uuid.uuid4().hex[:8]
    settings = Settings(data_dir=tmp_path, gateway_port=free_port())
    deploy = DeploySettings(
        public_model=f"pol-{tag}",
        bucket=f"models_{tag}",
        monitor_period_s=the_plan.analysis.period_s,
    )
    d = await build(bus, settings, deploy, engine=engine, validate=None, plan=the_plan)
    await d.deployer.bootstrap("tiny")
    await d.manager.sync(force=True)
    stop = asyncio.Event()
    import uvicorn

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
    await asyncio.sleep(0.3)  # the reward tracker's subscriptions
    try:
        yield Harness(d, bus, settings.gateway_port)
    finally:
        stop.set()
        server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()


async def register(h: Harness, ckpt: str | None = None, **serving: Any) -> str:
    from agentrl.release.actions import checkpoint_sha

    sha = checkpoint_sha(ckpt, h.d.manager.cache_dir) if ckpt else ""
    record = await h.d.deployer.register(
        checkpoint_path=ckpt or "",
        base_model="tiny",
        sha256=sha,
        training_job_id=str(uuid.uuid4()),
        serving=serving,
    )
    if ckpt is None:
        await h.d.registry.update_model(
            record.model_id, lambda r: setattr(r, "checkpoint_path", None)
        )
    return record.model_id


# min_samples 5 (10 before): the first step at 10 % gathers them in half the rounds of 40
# requests: 8-12 rounds -> 6, 23.2 -> 15.6 CPU-s with the file's start (load 5-7)
@pytest.mark.plan(plan(0.3, min_samples=5, max_reward_drop=1.0, max_error_increase=1.0))
async def test_good_version_is_promoted_through_every_step(
    harness: Harness, checkpoints: list[str]
) -> None:
    """Tolerances of the whole range: every check passes once both versions have
    `min_samples` (a step advances only on a passing analysis: issue 28)."""
    h = harness
    v = await register(h, checkpoints[0])
    await h.d.deployer.start(v, h.d.controller.plan, by="test")
    base = f"{h.public}-base"
    seen_weights = []
    for _ in range(60):
        served = await h.traffic(40, prefix=f"g{_}")
        assert not [k for k in served if k.startswith("error")], served
        await h.rewards(v, [0.6] * 3)
        await h.rewards(base, [0.6] * 3)
        record = await h.d.registry.require_model(v)
        seen_weights.append(record.traffic_weight)
        if record.state == "live":
            break
    assert record.state == "live"
    weights = [
        e["deployment_config"]["traffic_percentage"]
        for e in await h.events()
        if e["model_info"]["model_id"] == v
    ]
    assert weights[:4] == [10.0, 25.0, 50.0, 100.0] and weights[-1] == 100.0
    assert [e["metadata"]["action"] for e in await h.events()][-1] == "promote"
    actions = [x.action for x in record.decisions]
    assert (
        actions.count("set_weight") == 4 and "promote" in actions and actions.count("advance") == 3
    )
    assert (await h.d.registry.require_model(base)).state == "retired"
    served = await h.traffic(30, prefix="after")
    assert served == {v: 30}


@pytest.mark.plan(plan(60.0, period=1.0))
async def test_always_failing_version_is_rolled_back(harness: Harness) -> None:
    h = harness
    with ScriptedOpenAIServer([ScriptedReply(content="x", status=500)]) as bad:
        v = await register(h, None, kind="upstream", base_url=bad.base_url)
        await h.d.deployer.start(v, h.d.controller.plan, by="test")
        await asyncio.sleep(0.2)

        async def rolled_back() -> bool:
            # the registry turns rolled_back inside the controller's rollback call; its
            # last_action is set when that call returns
            state = (await h.d.registry.require_model(v)).state
            last = h.d.controller.last_action
            return state == "rolled_back" and last is not None and last[1] == "rollback"

        start = time.time()
        while not await rolled_back():
            await h.traffic(40, prefix=f"b{time.time()}")
            # inside the plan's 60 s pause: rolled back on the error evidence, not at the
            # step's end (bounds of 30 and 15 s failed at load 13, the rollback 20.5 s after
            # the first error)
            assert time.time() - start < 45
    stats = h.d.state.stats[v]
    assert h.d.controller.last_action is not None
    rollback_at = h.d.controller.last_action[0]
    assert h.d.controller.last_action[1] == "rollback"
    record = await h.d.registry.require_model(v)
    decision = record.decisions[-1]
    assert decision.action == "rollback" and "error_rate" in decision.reason
    check = next(c for c in decision.evidence["checks"] if c["metric"] == "error_rate")
    assert check["verdict"] == "fail" and check["new"]["n"] >= 10 and check["diff_lower"] > 0.05
    assert stats.first_error_at is not None and rollback_at - stats.first_error_at < 45

    async def routed_off() -> bool:
        return not h.d.state.weights.get(v)

    # the gateway follows the registry's split on its next sync (every 0.05 s here): the
    # registry said rolled_back while the gateway still routed 2 of 30 to it (a CI run)
    await h.wait_for(routed_off, 5.0)
    served = await h.traffic(30, prefix="after")
    assert served == {f"{h.public}-base": 30}  # traffic is back on the live version
    assert (await h.events())[-1]["metadata"]["action"] == "rollback"


@pytest.mark.plan(plan(60.0, period=0.5))
async def test_lower_reward_version_is_rolled_back_within_a_period(
    harness: Harness, checkpoints: list[str]
) -> None:
    h = harness
    v = await register(h, checkpoints[1])
    await h.d.deployer.start(v, h.d.controller.plan, by="test")
    base = f"{h.public}-base"
    await h.rewards(base, [0.9, 0.8, 0.85, 0.95] * 20)
    await h.rewards(v, [0.1, 0.2, 0.15, 0.05] * 10)
    await h.rewards(v, [0.1, 0.2, 0.15, 0.05] * 10, via_trajectory=True)  # joined by trajectory_id
    published = time.time()

    async def rolled_back() -> bool:
        return (await h.d.registry.require_model(v)).state == "rolled_back"

    took = await h.wait_for(rolled_back, 5.0)
    assert took <= 0.5 + 1.0, f"rollback took {took:.2f}s after the evidence"
    record = await h.d.registry.require_model(v)
    check = next(c for c in record.decisions[-1].evidence["checks"] if c["metric"] == "mean_reward")
    # decided as soon as the evidence sufficed: maybe before every reward had arrived
    assert (
        check["verdict"] == "fail"
        and 10 <= check["new"]["n"] <= 80
        and 10 <= check["live"]["n"] <= 80
    )
    assert check["diff_upper"] < -0.1
    split, _ = await h.d.registry.get_split(h.public)
    assert split is not None and split.weights == {base: 100.0}
    assert time.time() - published < 5


@pytest.mark.plan(plan(60.0, period=0.3))
async def test_bad_checksum_never_serves(
    harness: Harness, checkpoints: list[str], tmp_path: Path
) -> None:
    h = harness
    v = await register(h, checkpoints[2])
    await h.d.registry.update_model(v, lambda r: setattr(r, "sha256", "0" * 64))
    await h.d.deployer.start(v, h.d.controller.plan, by="test")

    async def rolled_back() -> bool:
        return (await h.d.registry.require_model(v)).state == "rolled_back"

    await h.wait_for(rolled_back, 5.0)
    record = await h.d.registry.require_model(v)
    assert (
        "ChecksumError" in record.decisions[-1].reason and "sha256" in record.decisions[-1].reason
    )
    assert v not in h.d.state.backends
    served = await h.traffic(50, prefix="cs")
    assert served == {f"{h.public}-base": 50}


@pytest.mark.plan(plan(0.2, period=0.2))
async def test_manual_pause_weight_rollback_through_api_and_cli(
    harness: Harness, checkpoints: list[str], nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrl.app.api import create_app

    h = harness
    v = await register(h, checkpoints[0])
    # `by` is the name of the caller's token (issue 29.12), never what the body says
    app = create_app(Settings(api_tokens={"t-alice": {"name": "alice", "scopes": ["*"]}}), h.bus)
    app.state.deploy_settings = h.d.settings
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://api", headers={"Authorization": "Bearer t-alice"}
    ) as api:
        assert (await api.post("/deploy/rollback", json={"reason": "x"})).status_code == 409
        r = await api.post(
            "/deploy/deploy",
            json={"model_id": v, "reason": "try it", "by": "agentrl-deploy-controller"},
        )
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "by"]
        r = await api.post("/deploy/deploy", json={"model_id": v, "reason": "try it"})
        assert r.status_code == 200, r.text
        r = await api.post("/deploy/pause", json={"reason": "looking at logs"})
        assert r.status_code == 200 and r.json()["paused"] is True
        await asyncio.sleep(1.0)  # several monitor periods: a paused rollout does not move
        assert (await h.d.registry.require_model(v)).traffic_weight == 10.0
        r = await api.post("/deploy/weight", json={"weight": 150})
        assert r.status_code == 409 and "between 0 and 100" in r.json()["detail"]
        r = await api.post("/deploy/weight", json={"weight": 40})
        assert r.status_code == 200
        split = (await api.get("/deploy/split")).json()["split"]
        assert split["weights"] == {v: 40.0, f"{h.public}-base": 60.0}
        r = await api.post(
            "/deploy/rollback", json={"reason": "bad answers; ask jane.doe@example.com"}
        )
        assert r.status_code == 200 and r.json()["model_id"] == f"{h.public}-base"
        record = (await api.get(f"/deploy/models/{v}")).json()
        assert record["state"] == "rolled_back"
        assert (
            record["decisions"][-1]["by"] == "alice"
            and record["decisions"][-1]["reason"].startswith("bad answers; ask ")
            and "jane.doe@example.com" not in record["decisions"][-1]["reason"]
        )
        toml = (await api.get("/deploy/tensorzero", params={"function": "agent"})).text
        assert f'"{h.public}-base" = 1' in toml
    await asyncio.sleep(0.2)
    assert await h.traffic(20, prefix="m") == {f"{h.public}-base": 20}
    # the CLI does the same through the registry
    from typer.testing import CliRunner

    from agentrl.cli import app as cli_app

    monkeypatch.setenv("AGENTRL_DEPLOY_PUBLIC_MODEL", h.public)
    monkeypatch.setenv("AGENTRL_DEPLOY_BUCKET", h.d.settings.bucket)
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(cli_app, ["deploy", *args, "--nats-url", nats_url])

    res = await asyncio.to_thread(cli, "rollback")
    assert res.exit_code == 2 and "no previous version" in res.output
    res = await asyncio.to_thread(cli, "promote", v, "--reason", "second look", "--by", "bob")
    assert res.exit_code == 0, res.output
    res = await asyncio.to_thread(cli, "rollback", "--reason", "no after all", "--by", "bob")
    assert res.exit_code == 0, res.output
    res = await asyncio.to_thread(cli, "show", v)
    shown = json.loads(res.stdout)  # stdout: a service of this test logs to stderr meanwhile
    assert shown["state"] == "rolled_back" and shown["decisions"][-1]["by"] == "bob"


async def test_gateway_restart_keeps_the_split(
    harness: Harness, checkpoints: list[str], engine: Any
) -> None:
    from agentrl.release.serving_manager import ServingManager
    from agentrl.serving.gateway import GatewayState

    h = harness
    v = await register(h, checkpoints[0])
    await h.d.deployer.start(
        v, RolloutPlan(steps=[Step(weight=30, pause_s=600), Step(weight=100)]), by="test"
    )
    fresh = GatewayState(h.public)
    await ServingManager(
        h.d.registry, fresh, h.d.settings, h.d.manager.cache_dir, engine=engine
    ).sync()
    assert fresh.weights == {v: 30.0, f"{h.public}-base": 70.0}


async def test_a_restarted_gateway_holds_the_live_version_during_a_full_canary_step(
    harness: Harness, checkpoints: list[str], engine: Any
) -> None:
    """At a canary's 100 % step the live version has no traffic, but a rollback restores
    it: a gateway restarted then loads it too, as the one before the restart kept it."""
    from agentrl.release.serving_manager import ServingManager
    from agentrl.serving.gateway import GatewayState

    h = harness
    v = await register(h, checkpoints[0])
    await h.d.deployer.start(v, RolloutPlan(steps=[Step(weight=100, pause_s=600)]), by="test")
    fresh = GatewayState(h.public)
    await ServingManager(
        h.d.registry, fresh, h.d.settings, h.d.manager.cache_dir, engine=engine
    ).sync()
    assert fresh.weights == {v: 100.0}
    assert f"{h.public}-base" in fresh.backends


@pytest.mark.plan(plan(0.2, period=0.2, min_samples=1000))
async def test_waiting_candidates_deploy_after_the_rollout_newest_first(
    harness: Harness, checkpoints: list[str]
) -> None:
    """Candidates validated while a rollout runs wait (recorded); when it ends the newest one
    is deployed and the older waiting ones are superseded, never served."""
    h = harness
    first = await register(h, checkpoints[0])
    await h.d.deployer.start(first, h.d.controller.plan, by="test")
    older = await register(h, checkpoints[1])
    newer = await register(h, checkpoints[2])
    for v in (older, newer):  # what validate_and_deploy does when a rollout is running
        record = await h.d.controller.validate_and_deploy(await h.d.registry.require_model(v))
        assert record.state == "candidate"
        assert record.decisions[-1].action == "wait"

    await h.d.deployer.promote(by="alice", reason="enough seen")  # min_samples=1000: it holds

    async def newer_canary() -> bool:
        return (await h.d.registry.require_model(newer)).state == "canary"

    await h.wait_for(newer_canary, 30)  # the controller deployed the newest waiting one
    await h.d.deployer.promote(by="alice", reason="enough seen")
    first_rec = await h.d.registry.require_model(first)
    older_rec = await h.d.registry.require_model(older)
    assert first_rec.state == "retired"  # promoted, then replaced by the newer candidate
    assert older_rec.state == "retired"
    assert older_rec.decisions[-1].action == "supersede"
    assert newer in older_rec.decisions[-1].reason
    assert all(d.action != "set_weight" for d in older_rec.decisions)  # never served


async def two_wait_then_older_deploys(
    h: Harness, checkpoints: list[str], live: float, older_mean: float, newer_mean: float
) -> tuple[str, str, str]:
    """A live version at benchmark `live` in a rollout; two candidates validated meanwhile
    wait, then record their benchmark means; the rollout is promoted by hand and the
    controller deploys a waiting one: returns (first, older, newer) once the older one is in
    its canary."""

    def bench(mean: float) -> Any:
        def store(r: Any) -> None:
            r.validation_details = {"benchmark": {"mean": mean, "episodes": {"fl": 30}}}

        return store

    first = await register(h, checkpoints[0])
    await h.d.registry.update_model(first, bench(live))
    await h.d.deployer.start(first, h.d.controller.plan, by="test")
    older = await register(h, checkpoints[1])
    newer = await register(h, checkpoints[2])
    for v, mean in ((older, older_mean), (newer, newer_mean)):
        record = await h.d.controller.validate_and_deploy(await h.d.registry.require_model(v))
        assert record.decisions[-1].action == "wait"
        await h.d.registry.update_model(v, bench(mean))

    await h.d.deployer.promote(by="alice", reason="enough seen")  # min_samples=1000: it holds

    async def older_canary() -> bool:
        return (await h.d.registry.require_model(older)).state == "canary"

    await h.wait_for(older_canary, 30)
    return first, older, newer


@pytest.mark.plan(plan(0.2, period=0.2, min_samples=1000))
async def test_an_older_waiting_candidate_that_scored_better_is_deployed_over_the_newest(
    harness: Harness, checkpoints: list[str]
) -> None:
    """Two candidates wait for a rollout; the older scored 0.47 on the benchmark, the newer
    0.30 (a job that over-fitted its batch). The older one is deployed; the newer one is
    superseded with both scores in its reason, never served."""
    h = harness
    _, older, newer = await two_wait_then_older_deploys(h, checkpoints, 0.1, 0.47, 0.3)
    older_rec = await h.d.registry.require_model(older)
    assert "benchmark 0.470, chosen among 2 waiting" in older_rec.decisions[-1].reason
    newer_rec = await h.d.registry.require_model(newer)
    assert newer_rec.state == "retired" and newer_rec.decisions[-1].action == "supersede"
    reason = newer_rec.decisions[-1].reason
    assert older in reason and "benchmark 0.470" in reason and "benchmark 0.300" in reason
    assert all(d.action != "set_weight" for d in newer_rec.decisions)  # never served


@pytest.mark.plan(plan(0.2, period=0.2, min_samples=1000))
async def test_waiting_candidate_worse_than_the_new_live_model_is_rejected(
    harness: Harness, checkpoints: list[str]
) -> None:
    """A candidate validated against an older live model waits; by the time the rollout ends
    a better version is live. The regression rule is applied again against that one: the
    newest waiting candidate regresses and is rejected, the next one within tolerance is
    deployed."""
    h = harness
    first, _, newer = await two_wait_then_older_deploys(h, checkpoints, 0.8, 0.77, 0.3)
    newer_rec = await h.d.registry.require_model(newer)
    assert newer_rec.state == "rejected"
    assert newer_rec.decisions[-1].action == "reject"
    assert first in newer_rec.decisions[-1].reason and "-0.500" in newer_rec.decisions[-1].reason
    assert all(d.action != "set_weight" for d in newer_rec.decisions)  # never served


async def test_a_retired_base_version_stays_servable_when_spares_are_unloaded(
    harness: Harness, checkpoints: list[str], engine: Any
) -> None:
    """Spares beyond `max_loaded` are unloaded oldest first, and a lineage's base version is
    the oldest: it was unloaded, and the loop's held-out evaluation of the base got a 404 for
    every episode (the lineage loop's base read 0/50 from errors). A version that is the
    base model holds no weights: it is never unloaded, nor counted."""
    from agentrl.release.serving_manager import ServingManager
    from agentrl.serving.gateway import GatewayState

    h = harness
    base = f"{h.public}-base"
    plan_now = RolloutPlan(steps=[Step(weight=100, pause_s=0)])
    first = await register(h, checkpoints[0])
    await h.d.deployer.start(first, plan_now, by="test")
    await h.d.deployer.promote(by="test", reason="live")
    second = await register(h, checkpoints[1])
    await h.d.deployer.start(second, plan_now, by="test")
    await h.d.deployer.promote(by="test", reason="live")
    assert (await h.d.registry.require_model(base)).state == "retired"
    fresh = GatewayState(h.public)
    manager = ServingManager(
        h.d.registry, fresh, h.d.settings, h.d.manager.cache_dir, engine=engine
    )
    for earlier in (base, first):  # served before (spares now), as a running gateway has them
        await manager._prepare(earlier)
    manager.max_loaded = 0  # every spare with weights goes
    await manager.sync(force=True)
    assert fresh.weights == {second: 100.0}
    assert first in fresh.backends  # the previous live version: never unloaded
    assert base in fresh.backends  # the base: weightless, kept
    answer = await fresh.backends[base].generate(
        base, ChatRequest(model=base, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    )
    assert answer.completion_tokens >= 1
