"""Per-version metrics follow the split (issue 28.10): after 25 versions have passed through
it the canary and the live version still have their own labels on the real `/metrics` (and
the shipped `AgentRLCanaryRewardBelowLive` can select the canary), versions that left are
evicted, names the registry never announced are "other"; and a fresh process that only reads
the split shows every listed family from its first scrape."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentrl.app.api import create_app
from agentrl.core.settings import Settings
from agentrl.observability import instrument
from agentrl.observability import metrics as m

FAMILIES = (
    "agent_rl_training_jobs_total",
    "agent_rl_model_reward_mean",
    "agent_rl_model_benchmark_score",
    "agent_rl_trajectories_collected_total",
    "agent_rl_trajectory_reward",
    "agent_rl_model_deployments_total",
)


def families(text: str) -> dict[str, list[Any]]:
    """family name (counters with their `_total`) -> its samples (none: left out)."""
    return {
        f.name + ("_total" if f.type == "counter" else ""): f.samples
        for f in text_string_to_metric_families(text)
        if f.samples
    }


async def scrape() -> str:
    transport = httpx.ASGITransport(app=create_app(Settings()))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        resp = await client.get("/metrics")
    assert resp.status_code == 200
    return resp.text


def versions_of(text: str, family: str) -> set[str]:
    return {s.labels["model_version"] for s in families(text).get(family, [])}


async def test_labels_follow_the_split_through_25_versions() -> None:
    for family in m.VERSION_FAMILIES:  # series other tests left (outside any split)
        family.clear()
    tag = uuid.uuid4().hex[:6]
    names = [f"{tag}-v{i}" for i in range(26)]
    for i in range(25):  # version i live, version i + 1 the canary; then it is promoted
        live, canary = names[i], names[i + 1]
        instrument.deployment(traffic={live: 0.9, canary: 0.1})
        for v in (live, canary):
            instrument.gateway_request(v, 0.01, error=False)
        instrument.deployment(rewards={live: 0.8, canary: 0.3})
        instrument.deployment(traffic={canary: 1.0})
    live, canary = names[24], names[25]
    instrument.deployment(traffic={live: 0.9, canary: 0.1})
    instrument.deployment(rewards={live: 0.8, canary: 0.3})
    instrument.gateway_request("gpt-somebody-else", 0.01, error=False)  # not in the registry
    text = await scrape()
    got = versions_of(text, "agent_rl_gateway_requests_total")
    assert {live, canary} <= got and "gpt-somebody-else" not in got and "other" in got
    assert not got & set(names[:23])  # left the split: evicted, not "the first 20 forever"
    assert len(versions_of(text, "agent_rl_model_traffic_ratio")) <= 3
    # the alert's selection: a reward mean whose version has 0 < traffic < 0.5
    fams = families(text)
    ratio = {s.labels["model_version"]: s.value for s in fams["agent_rl_model_traffic_ratio"]}
    mean = {s.labels["model_version"]: s.value for s in fams["agent_rl_model_reward_mean"]}
    canaries = [v for v, r in ratio.items() if 0 < r < 0.5 and not math.isnan(mean.get(v, 0))]
    lives = [v for v, r in ratio.items() if r >= 0.5]
    assert canaries == [canary] and lives == [live]
    assert mean[canary] == 0.3 and mean[live] == 0.8


async def test_validated_candidates_are_announced_within_the_slots() -> None:
    tag = uuid.uuid4().hex[:6]
    instrument.deployment(traffic={f"{tag}-live": 1.0})
    for i in range(30):
        instrument.deployment(scores={(f"{tag}-cand{i}", "tool_usage"): 0.5})
    labelled = m.MODEL_VERSION.labelled()
    assert f"{tag}-live" in labelled and len(labelled) == m.MODEL_VERSION.max_values
    assert m.MODEL_VERSION(f"{tag}-cand29") == f"{tag}-cand29"  # the newest kept
    assert m.MODEL_VERSION(f"{tag}-cand0") == "other"
    text = await scrape()
    assert f"{tag}-cand0" not in versions_of(text, "agent_rl_model_benchmark_score")


FRESH = textwrap.dedent(
    """
    import asyncio, sys
    import httpx
    from agentrl.app.api import create_app
    from agentrl.bus import Bus
    from agentrl.serving.registry import Registry
    from agentrl.core.settings import Settings

    async def main(url, bucket, public):
        bus = await Bus.connect(url)
        registry = await Registry.open(bus.js, bucket)
        await registry.get_split(public)  # what a restarted gateway does first
        transport = httpx.ASGITransport(app=create_app(Settings()))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            print((await c.get("/metrics")).text)
        await bus.close()

    asyncio.run(main(*sys.argv[1:]))
    """
)


async def test_a_fresh_process_shows_every_family_from_the_first_scrape(nats_url: str) -> None:
    from agentrl.bus import Bus
    from agentrl.release.actions import Deployer
    from agentrl.serving.registry import Registry

    tag = uuid.uuid4().hex[:8]
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    try:
        registry = await Registry.open(bus.js, f"labels_{tag}")
        deployer = Deployer(registry, bus, f"pol-{tag}", "http://x/v1")
        base = await deployer.bootstrap("tiny")
        assert base is not None
    finally:
        await bus.close()
    done = subprocess.run(
        [sys.executable, "-c", FRESH, nats_url, f"labels_{tag}", f"pol-{tag}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    fams = families(done.stdout)
    missing = [f for f in FAMILIES if f not in fams]
    assert not missing, missing
    jobs = {s.labels["status"]: s.value for s in fams["agent_rl_training_jobs_total"]}
    assert jobs["completed"] == 0.0 and jobs["failed"] == 0.0
    deploys = {s.labels["status"] for s in fams["agent_rl_model_deployments_total"]}
    assert {"canary", "promoted", "rolled_back"} <= deploys
    # the live version of the split has its own series at once
    assert base.model_id in versions_of(done.stdout, "agent_rl_trajectory_reward")
    assert base.model_id in versions_of(done.stdout, "agent_rl_model_reward_mean")


def test_benchmark_task_types_are_the_validators() -> None:
    from agentrl.release.validation import TASK_TYPES

    assert tuple(TASK_TYPES) == m.BENCHMARK_TASK_TYPES


MULTIPROCESS = textwrap.dedent(
    """
    import sys
    from agentrl.observability.multiproc import enable_multiprocess

    enable_multiprocess(sys.argv[1], clean=True)
    from agentrl.observability import instrument
    from agentrl.observability import metrics as m

    instrument.deployment(traffic={"va": 0.9, "vb": 0.1})
    instrument.gateway_request("va", 0.01, error=False)
    instrument.gateway_request("vb", 0.01, error=False)
    instrument.deployment(traffic={"vb": 1.0})  # vb promoted: va is in the previous split
    instrument.deployment(traffic={"vb": 0.9, "vc": 0.1})  # va evicted
    print(m.exposition().decode())
    """
)


def test_evicted_versions_leave_the_scrape_in_multiprocess_mode(tmp_path: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MULTIPROCESS, str(tmp_path / "mp")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = versions_of(done.stdout, "agent_rl_gateway_requests_total")
    assert got == {"vb", "vc"}, got
