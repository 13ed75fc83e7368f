"""The real thing: Debian's `prometheus` scrapes the control API's /metrics while the stack's
supervisor runs the real reward service over a real nats-server (trajectories in, rewards
out, one poison message dead-lettered); then every PromQL expression of the dashboards and
alert rules is evaluated through Prometheus's HTTP API without error, every metric they name
exists in its TSDB, and the rules load healthy. Services that a short run does not exercise
(training jobs, canaries, the gateway) record through the same hooks directly."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from agentrl.app.stack import stack_services
from agentrl.bus.server import EmbeddedNats
from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.subjects import TRAJECTORY
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.core.settings import Settings
from agentrl.observability import generate
from agentrl.observability import metrics as m

OPS = Path(__file__).resolve().parents[2] / "ops"
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus is missing: install Debian's `prometheus` package "
    "(apt-get install prometheus; scripts/setup.sh does it as root)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def activity() -> None:
    """What the services not running in this test record (one of each labelled series)."""
    m.record_training_status("completed")
    m.record_training_status("failed")
    m.observe(m.TRAINING_DURATION, 420.0)
    m.observe(m.TRAINING_SAMPLES, 2048)
    m.set_gauge(m.TRAINING_QUEUE_DEPTH, 1)
    m.set_gauge(m.TRAINING_JOBS_RUNNING, 1)
    m.inc(m.TRAINING_STEPS, 10)
    m.set_gauge(m.TRAINING_REWARD, 0.4)
    m.set_gauge(m.TRAINING_LOSS, 1.2)
    # two lineages (a version id names its lineage): `pa` rolls its canary back, `pb/dev`
    # promotes; each lineage's split sums to 1
    split = (("pa-v1", 0.9, 0.7), ("pa-v2", 0.1, 0.6), ("pb/dev-base", 0.5, 0.2))
    split += (("pb/dev-v1", 0.5, 0.3),)
    m.versions_changed(*m.MODEL_VERSION.set_split([v for v, _, _ in split]))
    for version, ratio, reward in split:
        labels = m.version_labels(version)
        m.set_gauge(m.MODEL_REWARD_MEAN, reward, **labels)
        m.set_gauge(m.MODEL_TRAFFIC_RATIO, ratio, **labels)
        m.set_gauge(m.MODEL_BENCHMARK_SCORE, 0.5, **labels, task_type="sokoban")
        m.record_gateway_request(version, 0.05, error=version == "pa-v2")
    m.record_deployment("canary", "pa")
    m.record_deployment("rolled_back", "pa")
    m.record_deployment("canary", "pb/dev")
    m.record_deployment("promoted", "pb/dev")
    m.record_training_status("completed", "pb/dev")
    m.observe(m.WAREHOUSE_BATCH_ROWS, 100, table="rewards")
    m.observe(m.WAREHOUSE_INSERT_LATENCY, 0.02, table="rewards")
    m.inc(m.WAREHOUSE_ROWS, 100, table="rewards")
    m.inc(m.COLLECTOR_ERRORS, 0, collector="jetstream")


async def test_prometheus_scrapes_up_and_evaluates_every_expression(tmp_path: Path) -> None:
    api_port, prom_port = free_port(), free_port()
    settings = Settings(api_port=api_port, data_dir=tmp_path / "data")
    config = yaml.safe_load((OPS / "prometheus/prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{api_port}"]}]
    rules = yaml.safe_load((OPS / "prometheus/agentrl.rules.yml").read_text())
    rules["groups"][0]["interval"] = "1s"
    (tmp_path / "agentrl.rules.yml").write_text(yaml.safe_dump(rules))
    config["rule_files"] = [str(tmp_path / "agentrl.rules.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))

    server = EmbeddedNats(data_dir=tmp_path / "nats")  # its own: the reward service's durable
    server.start()
    published = m.REWARDS_PUBLISHED._value.get()
    try:
        await run_with_prometheus(server.url, settings, tmp_path, api_port, prom_port, published)
    finally:
        server.stop()


async def run_with_prometheus(
    url: str, settings: Settings, tmp_path: Path, api_port: int, prom_port: int, published: float
) -> None:
    only = {"reward service", "control API"}
    async with stack_services(url, settings, only=only) as stack:
        events = [TrajectoryEvent.model_validate(sample_trajectory(i)) for i in range(30)]
        await stack.bus.publish_many(events)
        await stack.bus.publish_raw(TRAJECTORY, b'{"not": "a trajectory"}', "poison-1")
        deadline = time.monotonic() + 90
        while m.REWARDS_PUBLISHED._value.get() < published + 30:  # the real service scored
            assert time.monotonic() < deadline, "the reward service scored nothing in 90 s"
            await asyncio.sleep(0.2)
        durable = f"prom-{uuid.uuid4().hex[:8]}"
        await stack.bus.js.add_consumer(
            "RL_FEEDBACK",
            ConsumerConfig(
                durable_name=durable,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.NEW,
            ),
        )
        await stack.bus.publish_raw("agent.rl.feedback.v1", b"{}", f"prom-{durable}")
        activity()
        prom = subprocess.Popen(
            [
                PROMETHEUS,  # type: ignore[list-item]
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "prometheus.log", "w"),  # noqa: SIM115
        )
        base = f"http://127.0.0.1:{prom_port}"
        try:
            async with httpx.AsyncClient(base_url=base, timeout=5) as client:
                up = await wait_for_scrapes(client, prom, tmp_path, scrapes=3)
                assert up["health"] == "up", up
                activity()  # a second round so rate() and increase() have two points
                await asyncio.sleep(2.5)
                names = set((await client.get("/api/v1/label/__name__/values")).json()["data"])
                exprs = generate.expressions(OPS)
                for where, expr in exprs:
                    expr = expr.replace("$lineage", ".*")  # Grafana's All
                    resp = (await client.get("/api/v1/query", params={"query": expr})).json()
                    assert resp["status"] == "success", (where, expr, resp)
                    missing = set(re.findall(r"\bagent_rl_\w+", expr)) - names
                    assert not missing, (where, missing)
                assert "agent_rl_bus_consumer_pending_messages" in names  # from the collector
                got = (
                    await client.get(
                        "/api/v1/query",
                        params={"query": "sum(agent_rl_trajectories_collected_total)"},
                    )
                ).json()["data"]["result"]
                assert float(got[0]["value"][1]) >= 30  # from the reward service itself
                dlq = (
                    await client.get(
                        "/api/v1/query",
                        params={"query": "sum(agent_rl_bus_dead_letters_total)"},
                    )
                ).json()["data"]["result"]
                assert float(dlq[0]["value"][1]) >= 1  # the poison message, by the bus
                await lineages_apart(client)
                for _ in range(50):  # every rule evaluated, none with an error
                    got = (await client.get("/api/v1/rules")).json()["data"]["groups"][0]
                    if all(r["health"] == "ok" for r in got["rules"]):
                        break
                    await asyncio.sleep(0.2)
                assert len(got["rules"]) == 6, got
                assert all(r["health"] == "ok" for r in got["rules"]), got["rules"]
        finally:
            prom.terminate()
            prom.wait(timeout=20)
            await stack.bus.js.delete_consumer("RL_FEEDBACK", durable)


async def lineages_apart(client: httpx.AsyncClient) -> None:
    """Each lineage's series apart in Prometheus: its split, its rollbacks and promotions,
    its errors, its jobs (queried by the `lineage` label, as the dashboards do)."""

    async def by_lineage(query: str) -> dict[str, float]:
        got = (await client.get("/api/v1/query", params={"query": query})).json()
        return {r["metric"]["lineage"]: float(r["value"][1]) for r in got["data"]["result"]}

    lineages = 'lineage=~"pa|pb/dev"'
    assert await by_lineage(f"sum by (lineage) (agent_rl_model_traffic_ratio{{{lineages}}})") == {
        "pa": 1.0,
        "pb/dev": 1.0,
    }
    rolled = await by_lineage(
        f'agent_rl_model_deployments_total{{status="rolled_back",{lineages}}}'
    )
    assert rolled["pa"] >= 1 and rolled["pb/dev"] == 0
    promoted = await by_lineage(f'agent_rl_model_deployments_total{{status="promoted",{lineages}}}')
    assert promoted["pb/dev"] >= 1 and promoted["pa"] == 0
    errors = await by_lineage(f"sum by (lineage) (agent_rl_gateway_errors_total{{{lineages}}})")
    assert errors["pa"] >= 1 and errors["pb/dev"] == 0
    jobs = await by_lineage(f'agent_rl_training_jobs_total{{status="completed",{lineages}}}')
    assert jobs["pb/dev"] >= 1 and jobs["pa"] == 0
    versions = (
        await client.get(
            "/api/v1/query", params={"query": f"agent_rl_model_reward_mean{{{lineages}}}"}
        )
    ).json()["data"]["result"]
    assert {(r["metric"]["lineage"], r["metric"]["model_version"]) for r in versions} == {
        ("pa", "pa-v1"),
        ("pa", "pa-v2"),
        ("pb/dev", "pb/dev-base"),
        ("pb/dev", "pb/dev-v1"),
    }


async def wait_for_scrapes(
    client: httpx.AsyncClient, prom: subprocess.Popen[bytes], tmp: Path, scrapes: int
) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if prom.poll() is not None:
            raise AssertionError(f"prometheus exited: {(tmp / 'prometheus.log').read_text()}")
        try:
            # 503 "Service Unavailable" until its storage is ready: raise, wait, ask again
            got = (await client.get("/api/v1/targets")).raise_for_status()
            targets = got.json()["data"]["activeTargets"]
            if targets and targets[0]["health"] == "up":
                count = await client.get(
                    "/api/v1/query", params={"query": "count_over_time(up[1m])"}
                )
                result = count.raise_for_status().json()["data"]["result"]
                if result and float(result[0]["value"][1]) >= scrapes:
                    return targets[0]
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.3)
    raise AssertionError(f"no scrape within 60 s: {(tmp / 'prometheus.log').read_text()}")
