"""The services' hooks: batched histogram updates equal one-by-one observes, and a reward
batch lands in the right series (versions, domains, components, success)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.observability import instrument
from agentrl.observability import metrics as m


def test_observe_many_equals_observe() -> None:
    reg = CollectorRegistry()
    a = Histogram("a_seconds", "a", buckets=(0.1, 0.5, 1.0), registry=reg)
    b = Histogram("b_seconds", "b", buckets=(0.1, 0.5, 1.0), registry=reg)
    values = [0.05, 0.1, 0.3, 0.5, 0.7, 1.0, 3.0, float("nan"), -2.0]
    for v in values:
        if v == v:  # observe() would poison _sum with NaN; observe_many skips it
            a.observe(v)
    instrument.observe_many(b, values)
    text = generate_latest(reg).decode()
    a_lines = [
        ln.replace("a_seconds", "x")
        for ln in text.splitlines()
        if ln.startswith("a_seconds") and "_created" not in ln
    ]
    b_lines = [
        ln.replace("b_seconds", "x")
        for ln in text.splitlines()
        if ln.startswith("b_seconds") and "_created" not in ln
    ]
    assert a_lines[:5] == b_lines[:5] and len(a_lines) == 6  # buckets and count
    assert (
        float(a_lines[5].split()[1]) == float(b_lines[5].split()[1])
        or abs(float(a_lines[5].split()[1]) - float(b_lines[5].split()[1])) < 1e-9
    )  # the sum, up to float rounding


def trajectory(model: str, domain: str, turns: int, status: str) -> TrajectoryEvent:
    now = datetime.now(UTC).isoformat()
    turn = {
        "turn_id": 1,
        "timestamp": now,
        "observation": {"type": "user_message", "content": "hi"},
        "action": {"type": "response", "raw_response": "ok"},
    }
    return TrajectoryEvent.model_validate(
        {
            "session_id": str(uuid.uuid4()),
            "agent_id": str(uuid.uuid4()),
            "subordinate_profile": "coder",
            "start_timestamp": now,
            "end_timestamp": now,
            "turns": [{**turn, "turn_id": i + 1} for i in range(turns)],
            "task_context": {"task_id": str(uuid.uuid4()), "instructions": "x", "domain": domain},
            "metadata": {"model": model, "outcome": {"task_status": status}},
        }
    )


def test_reward_batch_records_every_series() -> None:
    version = f"rb-{uuid.uuid4().hex[:6]}"
    instrument.deployment(traffic={version: 1.0})  # a version of the split: labelled
    events = [
        trajectory(version, "coding", 3, "completed_successfully"),
        trajectory(version, "coding", 5, "failed"),
    ]
    rewards = [
        {
            "trajectory_id": e.trajectory_id,
            "total_reward": 0.9 - 0.5 * i,
            "reward_components": {"task_completion": {"score": 1.0 - i, "weight": 0.4}},
        }
        for i, e in enumerate(events)
    ]
    traj = m.TRAJECTORIES.labels(agent_type="coder", task_domain="coding")
    before = traj._value.get()
    published = m.REWARDS_PUBLISHED._value.get()
    instrument.reward_batch(events, rewards, 0.02)
    assert traj._value.get() == before + 2
    assert m.REWARDS_PUBLISHED._value.get() == published + 2
    child = m.TRAJECTORY_REWARD.labels(**m.version_labels(version))
    assert child._sum.get() == 0.9 + 0.4
    assert m.TRAJECTORY_SUCCESS.labels(**m.version_labels(version))._value.get() == 1
    m.set_enabled(False)
    try:
        instrument.reward_batch(events, rewards, 0.02)
    finally:
        m.set_enabled(True)
    assert traj._value.get() == before + 2  # off means off


def test_deployment_hook_zeroes_versions_that_left_the_split() -> None:
    instrument.deployment("canary", traffic={"dv1": 0.9, "dv2": 0.1}, rewards={"dv1": 0.7})
    instrument.deployment("rolled_back", traffic={"dv1": 1.0})
    assert m.MODEL_TRAFFIC_RATIO.labels(**m.version_labels("dv2"))._value.get() == 0.0
    assert m.MODEL_TRAFFIC_RATIO.labels(**m.version_labels("dv1"))._value.get() == 1.0
    assert (
        m.MODEL_DEPLOYMENTS.labels(lineage=m.DEFAULT_LINEAGE[0], status="rolled_back")._value.get()
        >= 1
    )


def test_bench_metrics_reports_hook_costs() -> None:
    from agentrl.bench.metrics import run_metrics_benchmark

    res = run_metrics_benchmark(batch=16, batches=2)
    assert set(res) == {
        "reward_hook_us_per_trajectory",
        "bus_hook_us_per_message",
        "gateway_hook_us_per_request",
        "scrape_ms",
        "scrape_bytes",
    }
    assert 0 < res["reward_hook_us_per_trajectory"] < 1000 and res["scrape_bytes"] > 1000
