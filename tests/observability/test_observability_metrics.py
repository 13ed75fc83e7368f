"""Metrics: bounded labels, never-failing helpers, `/metrics` with the JetStream collectors
against the real embedded nats-server, a failing collector skipped, multiprocess merging."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from prometheus_client.parser import text_string_to_metric_families

from agentrl.app.api import create_app
from agentrl.bus.client import Bus
from agentrl.core.settings import Settings
from agentrl.observability import collectors
from agentrl.observability import metrics as m


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_label_cap_keeps_the_first_values_then_other() -> None:
    cap = m.LabelCap("model_version", max_values=3)
    assert [cap(f"v{i}") for i in range(5)] == ["v0", "v1", "v2", "other", "other"]
    assert cap("v1") == "v1" and cap(None) == "other" and cap("x" * 500) == "other"
    fixed = m.LabelCap("status", allowed=("ok", "failed"))
    assert fixed("ok") == "ok" and fixed("weird") == "other"
    assert m.STATUS("rolled_back") == "rolled_back"


def test_seed_metric_names_follow_conventions() -> None:
    names = m.metric_names()
    for name in (
        "agent_rl_training_jobs_total",
        "agent_rl_training_duration_seconds_bucket",
        "agent_rl_training_samples_bucket",
        "agent_rl_model_reward_mean",
        "agent_rl_model_benchmark_score",
        "agent_rl_trajectories_collected_total",
        "agent_rl_trajectory_length_turns_bucket",
        "agent_rl_trajectory_reward_bucket",
        "agent_rl_model_deployments_total",
        "agent_rl_model_traffic_ratio",
        "agent_rl_gateway_requests_total",
        "agent_rl_gateway_errors_total",
        "agent_rl_bus_consumer_pending_messages",
        "agent_rl_bus_dead_letters_total",
        "agent_rl_reward_latency_seconds_bucket",
        "agent_rl_warehouse_insert_batch_rows_bucket",
        "agent_rl_training_queue_depth",
    ):
        assert name in names, name
    assert not any("percentage" in n or n.endswith("error_rate") for n in names)


def test_helpers_never_raise_and_can_be_switched_off() -> None:
    m.inc(m.GATEWAY_REQUESTS, no_such_label="x")  # wrong labels: logged, swallowed
    m.observe(m.REWARD_LATENCY, "not a number")  # type: ignore[arg-type]
    off = m.version_labels("bench-off")
    before = m.GATEWAY_REQUESTS.labels(**off)._value.get()
    m.set_enabled(False)
    try:
        m.inc(m.GATEWAY_REQUESTS, **off)
    finally:
        m.set_enabled(True)
    assert m.GATEWAY_REQUESTS.labels(**off)._value.get() == before
    m.versions_changed(*m.MODEL_VERSION.set_split(["bench-on"]))  # in the split: labelled
    m.record_gateway_request("bench-on", 0.2, error=True)
    text = m.exposition().decode()
    got = samples(text)
    on = (("lineage", m.DEFAULT_LINEAGE[0]), ("model_version", "bench-on"))  # no -vN: the default
    assert got[("agent_rl_gateway_errors_total", on)] == 1.0


async def test_metrics_endpoint_reports_consumer_lag_and_stream_depth(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    try:
        await bus.ensure_streams()
        durable = f"obs-{uuid.uuid4().hex[:8]}"
        await bus.js.add_consumer(
            "RL_FEEDBACK",
            ConsumerConfig(
                durable_name=durable,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.NEW,
            ),
        )
        for i in range(7):
            await bus.publish_raw("agent.rl.feedback.v1", b"{}", f"obs-{durable}-{i}")
        app = create_app(Settings(), bus)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            resp = await client.get("/metrics")
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
        got = samples(resp.text)
        key = (("consumer", durable), ("stream", "RL_FEEDBACK"))
        assert got[("agent_rl_bus_consumer_pending_messages", key)] == 7.0
        assert got[("agent_rl_bus_consumer_redelivered_messages", key)] == 0.0
        assert got[("agent_rl_bus_stream_messages", (("stream", "RL_FEEDBACK"),))] >= 7.0
        await bus.js.delete_consumer("RL_FEEDBACK", durable)
    finally:
        await bus.close()


async def test_a_failing_collector_is_logged_and_skipped(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(bus: object) -> None:
        raise RuntimeError("collector exploded")

    bus = await Bus.connect(nats_url)
    try:
        before = m.COLLECTOR_ERRORS.labels(collector="broken")._value.get()
        results = await collectors.run_collectors(
            bus, {"broken": broken, "jetstream": collectors.collect_streams}
        )
    finally:
        await bus.close()
    assert results["jetstream"] == "ok" and results["broken"].startswith("error: RuntimeError")
    assert m.COLLECTOR_ERRORS.labels(collector="broken")._value.get() == before + 1
    assert any("collector broken failed" in r.getMessage() for r in caplog.records)
    assert "agent_rl_bus_stream_messages" in m.exposition().decode()


CHILD = """
from agentrl.observability import metrics as m
assert m.MULTIPROCESS
m.inc(m.TRAINING_STEPS, {n})
m.set_gauge(m.TRAINING_REWARD, {n} / 10)
"""

PARENT = """
from agentrl.observability import metrics as m
print(m.exposition().decode())
"""


def test_multiprocess_mode_merges_job_processes(tmp_path: Path) -> None:
    env = {"AGENTRL_METRICS_MULTIPROC_DIR": str(tmp_path / "mp"), "PATH": "/usr/bin:/bin"}
    (tmp_path / "mp").mkdir()
    for n in (3, 4):  # two job processes, each its own pid
        subprocess.run([sys.executable, "-c", CHILD.format(n=n)], env=env, check=True)
    out = subprocess.run(
        [sys.executable, "-c", PARENT], env=env, check=True, capture_output=True, text=True
    ).stdout
    got = samples(out)
    assert got[("agent_rl_training_steps_total", ())] == 7.0
    assert got[("agent_rl_training_reward_mean", ())] == pytest.approx(0.4)  # most recent


LATE = """
import agentrl  # imports the bus, which imports the metrics: in-memory mode first
from agentrl.observability import metrics as m
assert not m.MULTIPROCESS
from agentrl.observability.multiproc import enable_multiprocess
enable_multiprocess({path!r}, clean=False)
assert m.MULTIPROCESS
m.inc(m.TRAINING_STEPS, 5)
m.inc(m.GATEWAY_REQUESTS, lineage="pol", model_version="late")
"""


def test_multiprocess_can_be_enabled_after_import(tmp_path: Path) -> None:
    mp = tmp_path / "mp"
    mp.mkdir()
    # the tree under test (a worktree's PYTHONPATH), not whichever the venv installed
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-c", LATE.format(path=str(mp))], env=env, check=True)
    out = subprocess.run(
        [sys.executable, "-c", PARENT],
        env={**env, "AGENTRL_METRICS_MULTIPROC_DIR": str(mp)},
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    got = samples(out)
    assert got[("agent_rl_training_steps_total", ())] == 5.0
    late = (("lineage", "pol"), ("model_version", "late"))
    assert got[("agent_rl_gateway_requests_total", late)] == 1.0
