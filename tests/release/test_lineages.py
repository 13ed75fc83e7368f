"""Lineages end to end on a real nats-server, the real gateway over HTTP (uvicorn), the
registry, the serving manager and one controller per lineage (`Fleet`): two lineages route
apart (each its own sticky split), agents and Agent Zero profiles reach their lineage, a
rollback in one never touches the other's split, and bad lineage input gets a clear 4xx
from the control API (nothing written)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl.bench.testing_server import ScriptedOpenAIServer, ScriptedReply
from agentrl.bus import Bus
from agentrl.core.settings import Settings
from agentrl.release.lineage import Lineages, check_name
from agentrl.release.service import Deployment, build
from agentrl.serving.config import Analysis, DeploySettings, RolloutPlan, Step
from agentrl.serving.gateway import VERSION_HEADER, create_gateway_app
from deploy_helpers import free_port


def _plan(pause: float) -> RolloutPlan:
    return RolloutPlan(
        strategy="canary",
        steps=[Step(weight=w, pause_s=pause) for w in (50, 100)],
        analysis=Analysis(period_s=0.2, min_samples=10, reward_range=(0.0, 1.0)),
    )


class Two:
    """A deployment with lineages `a` (agent `coder`, profile `developer`) and `b`
    (profile `researcher`) beside the default one."""

    def __init__(self, d: Deployment, bus: Bus, port: int, a: str, b: str) -> None:
        self.d, self.bus, self.a, self.b = d, bus, a, b
        self.url = f"http://127.0.0.1:{port}/v1"
        # one client for the ~100 requests: a new one builds an SSL context (~40 ms CPU each)
        self.client = httpx.AsyncClient(timeout=30)

    async def ask(
        self, model: str, session: str, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        return await self.client.post(
            f"{self.url}/chat/completions",
            headers=headers or {},
            json={
                "model": model,
                "user": session,
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )

    async def served(self, model: str, n: int, prefix: str, **kw: Any) -> dict[str, str]:
        """session -> the version that answered it (200s only; others fail the test)."""
        out = {}
        for i in range(n):
            r = await self.ask(model, f"{prefix}-{i}", **kw)
            assert r.status_code == 200, r.text
            out[f"{prefix}-{i}"] = r.headers[VERSION_HEADER]
        return out

    async def register(self, lineage: str, ckpt: str | None, **serving: Any) -> str:
        from agentrl.release.actions import Deployer, checkpoint_sha

        d = Deployer(self.d.registry, self.bus, lineage)
        record = await d.register(
            checkpoint_path=ckpt or "",
            base_model="tiny",
            sha256=checkpoint_sha(ckpt, self.d.manager.cache_dir) if ckpt else "",
            training_job_id=str(uuid.uuid4()),
            serving=serving,
        )
        if ckpt is None:
            await self.d.registry.update_model(
                record.model_id, lambda r: setattr(r, "checkpoint_path", None)
            )
        return record.model_id

    async def wait_for(self, predicate: Any, timeout: float) -> None:
        start = time.time()
        while time.time() - start < timeout:
            if await predicate():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"condition not met within {timeout}s")


@pytest.fixture()
async def two(nats_url: str, engine: Any, tmp_path: Path):
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    tag = uuid.uuid4().hex[:8]
    settings = Settings(data_dir=tmp_path, gateway_port=free_port())
    deploy = DeploySettings(public_model=f"pol-{tag}", bucket=f"models_{tag}")
    d = await build(bus, settings, deploy, engine=engine, validate=None, plan=_plan(60.0))
    await d.deployer.bootstrap("tiny")
    lineages = Lineages(d.registry, deploy.public_model)
    a, b = f"t{tag}/dev", f"t{tag}/research"
    await lineages.create(a, base_model="tiny", agents=["coder"], profiles=["developer"], by="t")
    await lineages.create(b, base_model="tiny", profiles=["researcher"], by="t")
    await d.manager.sync(force=True)
    await d.fleet.refresh()
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
            d.fleet.run(stop),
            d.tracker.run(bus, stop),
            server.serve(),
        )
    ]
    while not server.started:
        await asyncio.sleep(0.01)
    t = Two(d, bus, settings.gateway_port, a, b)
    try:
        yield t
    finally:
        await t.client.aclose()
        stop.set()
        server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()


async def test_two_lineages_route_apart_with_sticky_sessions_and_agent_mapping(
    two: Two, checkpoints: list[str]
) -> None:
    t = two
    v = await t.register(t.a, checkpoints[0])
    a_deployer = t.d.fleet.controllers[t.a].deployer
    await a_deployer.start(v, t.d.fleet.plan, by="test")  # 50 % canary in lineage a
    b_before = await t.d.registry.get_split(t.b)

    async def routed() -> bool:
        return v in t.d.state.split_of(t.a)

    await t.wait_for(routed, 10)
    a_served = await t.served(t.a, 24, "s")
    assert set(a_served.values()) == {f"{t.a}-base", v}  # both halves of a's split, only a's
    again = await t.served(t.a, 24, "s")
    assert again == a_served  # sticky per session
    b_served = await t.served(t.b, 12, "s")  # the same sessions, lineage b: b's only version
    assert set(b_served.values()) == {f"{t.b}-base"}
    default = t.d.settings.public_model
    assert set((await t.served(default, 6, "s")).values()) == {f"{default}-base"}
    # agents and Agent Zero profiles reach their lineage through the default name
    by_profile = await t.served(default, 6, "p", headers={"x-agentrl-profile": "researcher"})
    assert set(by_profile.values()) == {f"{t.b}-base"}
    by_agent = await t.served(default, 24, "s", headers={"x-agentrl-agent": "coder"})
    assert by_agent == a_served  # the same sticky choice as asking for a by name
    other = await t.served(default, 4, "q", headers={"x-agentrl-profile": "hacker"})
    assert set(other.values()) == {f"{default}-base"}  # unmapped: the default lineage
    # the canary's evidence is a's only; b's split never moved
    assert t.d.state.stats[v].requests > 0
    assert (await t.d.registry.get_split(t.b))[1] == b_before[1]
    # /v1/models lists the lineages; an unknown one is a clear 404
    async with httpx.AsyncClient(timeout=10) as client:
        ids = [m["id"] for m in (await client.get(f"{t.url}/models")).json()["data"]]
    assert ids[:3] == [default, t.a, t.b]
    r = await t.ask("nobody/none", "s-0")
    assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
    assert t.a in r.json()["error"]["message"]
    # a lineage's actions never take another lineage's version
    from agentrl.serving.errors import DeployError

    with pytest.raises(DeployError, match="belongs to lineage"):
        await t.d.fleet.controllers[t.b].deployer.promote(v, by="test", reason="wrong lineage")


@pytest.mark.usefixtures("fresh_label_caps")  # its /metrics check reads both lineages
async def test_rollback_in_one_lineage_leaves_the_other_split_untouched(
    two: Two, checkpoints: list[str]
) -> None:
    t = two
    vb = await t.register(t.b, checkpoints[1])
    await t.d.fleet.controllers[t.b].deployer.start(vb, t.d.fleet.plan, by="test")

    async def b_routed() -> bool:
        return vb in t.d.state.split_of(t.b)

    await t.wait_for(b_routed, 10)
    b_split, b_rev = await t.d.registry.get_split(t.b)
    with ScriptedOpenAIServer([ScriptedReply(content="x", status=500)]) as bad:
        va = await t.register(t.a, None, kind="upstream", base_url=bad.base_url)
        await t.d.fleet.controllers[t.a].deployer.start(va, t.d.fleet.plan, by="test")

        async def rolled_back() -> bool:
            for i in range(20):  # a's traffic: half goes to the failing canary
                await t.ask(t.a, f"r{time.time()}-{i}")
            await t.ask(t.b, f"rb{time.time()}")
            return (await t.d.registry.require_model(va)).state == "rolled_back"

        await t.wait_for(rolled_back, 40)
    record = await t.d.registry.require_model(va)
    assert record.decisions[-1].action == "rollback" and "error_rate" in record.decisions[-1].reason
    a_split, _ = await t.d.registry.get_split(t.a)
    assert a_split is not None and a_split.weights == {f"{t.a}-base": 100.0}
    after, rev = await t.d.registry.get_split(t.b)
    assert rev == b_rev and after is not None and after.weights == b_split.weights
    assert (await t.d.registry.get_rollout(t.b)).status == "running"  # type: ignore[union-attr]
    assert (await t.d.registry.require_model(vb)).state == "canary"
    served = await t.served(t.a, 10, "after")
    assert set(served.values()) == {f"{t.a}-base"}
    await _metrics_apart(t, va, vb)


async def _metrics_apart(t: Two, va: str, vb: str) -> None:
    """/metrics (the control API's scrape): each lineage's series apart, labelled by its
    lineage: a's rollback and failing canary are a's only, b's running canary b's only."""
    from prometheus_client.parser import text_string_to_metric_families

    from agentrl.app.api import create_app

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(Settings())), base_url="http://api"
    ) as api:
        text = (await api.get("/metrics")).text
    series: dict[str, dict[tuple[str, str, str], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "lineage" in s.labels and s.labels["lineage"] in (t.a, t.b):
                key = (
                    s.labels["lineage"],
                    s.labels.get("model_version", ""),
                    s.labels.get("status", ""),
                )
                series.setdefault(s.name, {})[key] = s.value
    deploys = series["agent_rl_model_deployments_total"]
    assert deploys[(t.a, "", "rolled_back")] >= 1 and deploys.get((t.b, "", "rolled_back"), 0) == 0
    assert deploys[(t.b, "", "canary")] >= 1
    errors = series["agent_rl_gateway_errors_total"]
    assert errors[(t.a, va, "")] >= 1  # the failing canary's errors, under lineage a
    assert all(v == 0 for (lin, _, _), v in errors.items() if lin == t.b)
    requests = series["agent_rl_gateway_requests_total"]
    assert requests[(t.b, vb, "")] + requests[(t.b, f"{t.b}-base", "")] >= 1
    for name, values in series.items():  # a version is only ever under its own lineage
        for lin, version, _ in values:
            assert version in ("", "other") or version.startswith(f"{lin}-"), (name, version)
    ratio = series["agent_rl_model_traffic_ratio"]
    assert ratio[(t.a, f"{t.a}-base", "")] == 1.0 and ratio[(t.a, va, "")] == 0.0
    assert sum(v for (lin, _, _), v in ratio.items() if lin == t.b) == 1.0
    assert ratio[(t.b, vb, "")] > 0


async def test_bad_lineage_input_gets_clear_4xx_and_writes_nothing(two: Two) -> None:
    from agentrl.app.api import create_app

    t = two
    app = create_app(Settings(api_tokens={"t-bob": {"name": "bob", "scopes": ["*"]}}), t.bus)
    app.state.deploy_settings = t.d.settings
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://api",
        headers={"Authorization": "Bearer t-bob"},
    ) as api:
        table_before = await t.d.fleet.lineages.table()
        checks = [
            ({"name": t.a}, 409, "already exists"),
            ({"name": "x-new", "agents": ["coder"]}, 409, "already belong"),
            ({"name": "x-new", "profiles": ["researcher"]}, 409, "already belong"),
            ({"name": "Bad Name"}, 422, "not valid"),
            ({"name": "a..b"}, 422, "not valid"),
            ({"name": "x" * 65}, 422, "longer than"),
            ({"name": "x-v3"}, 422, "version id"),
            ({"name": "x-new", "from_lineage": "nowhere"}, 404, "no lineage"),
            ({"name": "x-new", "validation": {"gateway_port": 1}}, 422, "not validation"),
        ]
        for body, status, text in checks:
            r = await api.post("/deploy/lineages", json=body)
            assert r.status_code == status, (body, r.text)
            assert text in r.text, (body, r.text)
        assert await t.d.fleet.lineages.table() == table_before  # nothing written
        r = await api.post("/deploy/lineages/nowhere/map", json={"agents": ["z"]})
        assert r.status_code == 404 and "no lineage 'nowhere'" in r.text
        r = await api.post("/deploy/lineages/nowhere/pause", json={})
        assert r.status_code == 404
        r = await api.post("/deploy/rollback", json={"lineage": "nowhere"})
        assert r.status_code == 404
        r = await api.get("/deploy/split", params={"lineage": "nowhere"})
        assert r.status_code == 404
        r = await api.post(f"/deploy/lineages/{t.d.settings.public_model}/retire", json={})
        assert r.status_code == 409 and "default lineage" in r.text
        # a new lineage from another's live version, listed; then retired: 404 at the gateway
        r = await api.post(
            "/deploy/lineages", json={"name": "x-new/sub", "from_lineage": t.a, "agents": ["z"]}
        )
        assert r.status_code == 201, r.text
        assert r.json()["start"] == "lineage" and r.json()["parent_model"] == f"{t.a}-base"
        assert r.json()["split"]["live"] == "x-new/sub-base"
        names = [x["name"] for x in (await api.get("/deploy/lineages")).json()]
        assert names == [t.d.settings.public_model, t.a, t.b, "x-new/sub"]
        assert (await api.get("/deploy/lineages/x-new/sub")).json()["agents"] == ["z"]

        async def routed() -> bool:
            return bool(t.d.state.split_of("x-new/sub"))

        await t.wait_for(routed, 10)
        assert (await t.ask("x-new/sub", "s")).status_code == 200
        r = await api.post("/deploy/lineages/x-new/sub/retire", json={"reason": "done"})
        assert r.status_code == 200 and r.json()["state"] == "retired"
        r = await api.post("/deploy/lineages/x-new/sub/map", json={"agents": ["y"]})
        assert r.status_code == 409 and "retired" in r.text

        async def gone() -> bool:
            return (await t.ask("x-new/sub", "s")).status_code == 404

        await t.wait_for(gone, 10)
        assert "retired" in (await t.ask("x-new/sub", "s")).json()["error"]["message"]
        # its agent is free again (a new lineage may claim it)
        r = await api.post("/deploy/lineages", json={"name": "x-other", "agents": ["z"]})
        assert r.status_code == 201, r.text


def test_lineage_names() -> None:
    for good in ("agent0/developer", "a", "pmoves.coder-2", "x_y/z"):
        assert check_name(good) == good
    for bad in ("", "/a", "a/", "a//b", "A", "a b", "a.", "a..b", "a*", "a>", "x-base", "x-v12"):
        with pytest.raises(ValueError):
            check_name(bad)


def _status(ckpt: str, lineage: str | None) -> Any:
    from agentrl.contracts.base import utcnow
    from agentrl.contracts.training import TrainingStatus

    return TrainingStatus.model_validate(
        {
            "training_job_id": str(uuid.uuid4()),
            "timestamp": utcnow().isoformat(),
            "status": "completed",
            "artifacts": {"final_checkpoint": ckpt, "base_model": "tiny"},
            "metadata": {"lineage": lineage} if lineage else {},
        }
    )


async def test_a_job_status_registers_into_its_lineage_and_a_paused_lineage_waits(
    two: Two, checkpoints: list[str]
) -> None:
    t = two
    fleet = t.d.fleet
    record = await fleet.handle_status(_status(checkpoints[0], t.a))
    assert record.public_name == t.a and record.model_id == f"{t.a}-v1"
    assert (await t.d.registry.get_rollout(t.a)).model_id == record.model_id  # type: ignore[union-attr]
    assert await t.d.registry.get_rollout(t.b) is None  # b never saw it
    # a status naming no lineage is the default one's; an unknown lineage registers nothing
    default = await fleet.handle_status(_status(checkpoints[1], None))
    assert default.public_name == t.d.settings.public_model
    before = len(await t.d.registry.list_models())
    assert await fleet.handle_status(_status(checkpoints[2], "nowhere/none")) is None
    assert len(await t.d.registry.list_models()) == before
    # a paused lineage: its canary holds, a new candidate waits; resumed, it goes on
    await fleet.lineages.set_state(t.a, "paused", by="t", reason="look", bus=t.bus)
    assert (await t.d.registry.get_rollout(t.a)).paused  # type: ignore[union-attr]
    await fleet.refresh(force=True)
    assert fleet.controllers[t.a].halted and await fleet.controllers[t.a].tick() == "paused"
    waiting = await fleet.handle_status(_status(checkpoints[2], t.b))
    assert waiting.public_name == t.b  # b is not paused: deployed as usual
    await fleet.lineages.set_state(t.a, "active", by="t", reason="ok", bus=t.bus)
    assert not (await t.d.registry.get_rollout(t.a)).paused  # type: ignore[union-attr]


@pytest.mark.usefixtures("fresh_label_caps")  # a process's 33rd lineage is "other"
async def test_one_lineages_split_write_keeps_the_others_traffic_metric(nats_url: str) -> None:
    """The traffic ratio per version (its id names its lineage) of every lineage: a write of
    one lineage's split used to zero every other lineage's versions."""
    from agentrl.observability import metrics as m
    from agentrl.serving.registry import Registry

    bus = await Bus.connect(nats_url)
    try:
        registry = await Registry.open(bus.js, f"models_{uuid.uuid4().hex[:8]}")
        tag = uuid.uuid4().hex[:6]
        a, b = f"m{tag}/a", f"m{tag}/b"

        def split(weights: dict[str, float]) -> Any:
            def apply(s: Any) -> None:
                s.weights, s.order = weights, list(weights)

            return apply

        await registry.update_split(a, split({f"{a}-v1": 10.0, f"{a}-base": 90.0}))
        await registry.update_split(b, split({f"{b}-base": 100.0}))
        ratio = m.MODEL_TRAFFIC_RATIO
        assert ratio.labels(lineage=a, model_version=f"{a}-v1")._value.get() == 0.1
        assert ratio.labels(lineage=b, model_version=f"{b}-base")._value.get() == 1.0
        await registry.update_split(a, split({f"{a}-base": 100.0}))  # a's canary left
        assert ratio.labels(lineage=a, model_version=f"{a}-v1")._value.get() == 0.0
        assert ratio.labels(lineage=b, model_version=f"{b}-base")._value.get() == 1.0
    finally:
        await bus.close()


async def test_a_lineages_canary_the_gateway_cannot_serve_is_rolled_back_in_its_lineage(
    two: Two, checkpoints: list[str]
) -> None:
    t = two
    v = await t.register(t.a, checkpoints[2])
    await t.d.registry.update_model(v, lambda r: setattr(r, "sha256", "0" * 64))
    _, b_rev = await t.d.registry.get_split(t.b)
    await t.d.fleet.controllers[t.a].deployer.start(v, t.d.fleet.plan, by="test")

    async def rolled_back() -> bool:
        return (await t.d.registry.require_model(v)).state == "rolled_back"

    await t.wait_for(rolled_back, 10.0)
    assert "ChecksumError" in (await t.d.registry.require_model(v)).decisions[-1].reason
    assert set((await t.served(t.a, 10, "cs")).values()) == {f"{t.a}-base"}
    assert (await t.d.registry.get_split(t.b))[1] == b_rev


def test_lineage_cli_refuses_bad_input(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from agentrl.cli import app as cli_app

    tag = uuid.uuid4().hex[:8]
    monkeypatch.setenv("AGENTRL_DEPLOY_PUBLIC_MODEL", f"pol-{tag}")
    monkeypatch.setenv("AGENTRL_DEPLOY_BUCKET", f"models_{tag}")
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(cli_app, ["lineage", *args, "--nats-url", nats_url])

    res = cli("create", "Bad Name")
    assert res.exit_code == 2 and "not valid" in res.output
    res = cli("create", "agent0/dev", "--agent", "coder", "--profile", "developer")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["start"] == "base"
    res = cli("create", "agent0/dev")
    assert res.exit_code == 2 and "already exists" in res.output
    res = cli("create", "agent0/dev2", "--agent", "coder")
    assert res.exit_code == 2 and "already belong" in res.output
    res = cli("create", "agent0/sub", "--from", "agent0/dev")
    assert res.exit_code == 0 and json.loads(res.stdout)["parent_model"] == "agent0/dev-base"
    res = cli("rollback", "agent0/dev")
    assert res.exit_code == 2 and "no previous version" in res.output
    assert cli("rollback", "nowhere").exit_code == 2
    res = cli("promote", "agent0/dev", "agent0/sub-base")
    assert res.exit_code == 2 and "belongs to lineage 'agent0/sub'" in res.output
    assert cli("pause", "nowhere").exit_code == 2
    assert cli("map", "nowhere", "--agent", "x").exit_code == 2
    res = cli("pause", "agent0/dev")
    assert res.exit_code == 0 and json.loads(res.stdout)["state"] == "paused"
    res = cli("retire", "agent0/sub")
    assert res.exit_code == 0 and json.loads(res.stdout)["state"] == "retired"
    listed = json.loads(cli("list").output)
    assert [(x["name"], x["state"]) for x in listed] == [
        (f"pol-{tag}", "active"),
        ("agent0/dev", "paused"),
        ("agent0/sub", "retired"),
    ]
    assert listed[1]["live"] == "agent0/dev-base" and listed[1]["rollout"] is None
    assert listed[1]["weights"] == {"agent0/dev-base": 100.0}


async def test_a_lineage_validates_on_its_own_benchmark(
    nats_url: str, tmp_path: Path, engine: Any
) -> None:
    from agentrl.release.validation import Validator

    bus = await Bus.connect(nats_url)
    try:
        tag = uuid.uuid4().hex[:8]
        deploy = DeploySettings(public_model=f"pol-{tag}", bucket=f"models_{tag}")
        d = await build(bus, Settings(data_dir=tmp_path), deploy, engine=engine)
        await d.deployer.bootstrap("tiny")
        tasks = {"research_synthesis": ["frozenlake-4x4"]}
        await d.fleet.lineages.create(
            "solver/lake",
            base_model="tiny",
            validation={"benchmark_tasks": tasks, "benchmark_seed": 7},
            by="t",
        )
        await d.fleet.lineages.create("plain", base_model="tiny", by="t")
        controllers = await d.fleet.refresh()
        own = controllers["solver/lake"]
        assert isinstance(own.validate, Validator) and own.validate is not d.controller.validate
        assert own.validate.task_types == tasks and own.validate.settings.benchmark_seed == 7
        assert own.settings.benchmark_seed == 7  # its regression rule reads its own settings
        assert controllers["plain"].validate is d.controller.validate  # no overrides: shared
    finally:
        await bus.close()


async def test_bench_lineages_runs_and_reports_each_figure(nats_url: str, tmp_path: Path) -> None:
    from agentrl.bench.lineages import bench

    out = await bench(nats_url, tmp_path, many=4, rounds=2)
    for key in ("tick_rollout_p50_ms_1", "tick_idle_p50_ms_1_idle", "tick_rollout_p50_ms_4"):
        assert out[key] is not None and out[key] > 0, out
    assert out["tick_idle_p50_ms_4"] > 0 and out["tick_ratio_rollout"] > 0


def test_gateway_routing_by_lineage_is_dict_lookups_and_waits_for_a_routed_lineage() -> None:
    from agentrl.serving.gateway import GatewayState

    state = GatewayState("pol")
    state.backends.update({"pol-base": object(), "x-base": object(), "x-v1": object()})  # type: ignore[dict-item]
    state.set_split({"pol-base": 100.0}, ["pol-base"])
    state.set_lineages(["x"], {"a1": "x"}, {"researcher": "x"}, {"gone"})
    # mapped to x, but x routes nothing yet (just created): the asked name serves
    assert state.lineage_for("pol", "a1", None) == "pol"
    state.set_split({"x-v1": 10.0, "x-base": 90.0}, ["x-v1", "x-base"], "x")
    assert state.lineage_for("pol", "a1", None) == "x"
    assert state.lineage_for("pol", None, "researcher") == "x"
    assert state.lineage_for("pol", "someone", "hacker") == "pol"
    assert state.lineage_for("x", "a1", None) == "x"  # a lineage asked by name stays
    assert state.weights == {"pol-base": 100.0}  # the default split untouched
    picks = {state.resolve("x", f"s{i}") for i in range(200)}
    assert picks == {"x-v1", "x-base"}
    assert {state.resolve("x", "s7") for _ in range(20)} == {state.resolve("x", "s7")}
    assert state.models()[:2] == ["pol", "x"] and "gone" in state.retired
    with pytest.raises(KeyError):
        state.resolve("gone", "s")
    state.set_lineages([], {}, {}, {"x"})  # x retired: no route left
    with pytest.raises(KeyError):
        state.resolve("x", "s")
