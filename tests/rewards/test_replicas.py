"""Reward services as replicas: two `agentrl rewards serve` processes on one durable consumer.

Each replica has its own data dir, as on two machines: exactly one reward per (trajectory,
version) must come from the shared records in NATS KV and the reward stream, not from a
local file. JetStream's duplicate window is shrunk to one second after the services start,
so nothing passes because the server happened to drop a second copy."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from agentrl.bench.rewards import read_stream
from agentrl.bus import Bus, EmbeddedNats
from agentrl.bus.kv import kv_keys
from agentrl.contracts.feedback import FeedbackEvent
from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.rewards.claims import bucket_name

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    srv = EmbeddedNats(data_dir=tmp_path_factory.mktemp("rewards-replicas-nats"))
    srv.start()
    yield srv
    srv.stop()


def serve(
    url: str, data_dir: Path, replica: str, durable: str, log: Path
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "agentrl.cli", "rewards", "serve", "--nats-url", url]
    cmd += ["--data-dir", str(data_dir), "--durable", durable, "--batch", "64", "--ack-wait", "3"]
    env = {**os.environ, "COLUMNS": "200", "AGENTRL_REPLICA": replica}
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)


async def fresh_bus(server: EmbeddedNats) -> Bus:
    bus = await Bus.connect(server.url)
    await bus.ensure_streams()
    for stream in ("RL_TRAJECTORIES", "RL_REWARDS", "RL_FEEDBACK", "RL_DLQ"):
        await bus.js.purge_stream(stream)
    return bus


async def start_replicas(
    bus: Bus,
    url: str,
    tmp_path: Path,
    durable: str,
    names: tuple[str, ...] = ("a", "b"),
    one_data_dir: bool = False,
) -> dict[str, subprocess.Popen[bytes]]:
    def data(n: str) -> Path:
        return tmp_path / ("shared" if one_data_dir else n)

    procs = {n: serve(url, data(n), n, durable, tmp_path / f"{n}.log") for n in names}
    deadline = time.monotonic() + 90
    while True:  # both replicas are past their ensure_streams (which restores the windows)
        for n, p in procs.items():
            assert p.poll() is None, (tmp_path / f"{n}.log").read_text()
        assert time.monotonic() < deadline, "the services never started"
        logs = [(tmp_path / f"{n}.log").read_text() for n in names]
        if all("reward service started" in text for text in logs):
            break
        await asyncio.sleep(0.05)
    for stream in ("RL_TRAJECTORIES", "RL_REWARDS", "RL_FEEDBACK"):
        cfg = (await bus.js.stream_info(stream)).config
        cfg.duplicate_window = 1.0
        await bus.js.update_stream(cfg)
    return procs


def stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for p in procs.values():
        if p.poll() is None:  # SIGTERM drains every publish in flight before exiting
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        p.wait(30)


async def reward_count(bus: Bus) -> int:
    return int((await bus.js.stream_info("RL_REWARDS")).state.messages)


async def settled(bus: Bus, durable: str) -> bool:
    """Both consumers have acked everything their streams hold."""
    for stream, name in (("RL_TRAJECTORIES", durable), ("RL_FEEDBACK", f"{durable}-feedback")):
        info = await bus.js.consumer_info(stream, name)
        if info.num_pending or info.num_ack_pending:
            return False
    return True


async def wait_for(
    bus: Bus, procs: dict[str, subprocess.Popen[bytes]], want: int, logs: Path
) -> None:
    deadline = time.monotonic() + 120
    while await reward_count(bus) < want:
        for n, p in procs.items():
            assert p.poll() is None or p.returncode == -signal.SIGKILL, (
                logs / f"{n}.log"
            ).read_text()
        assert time.monotonic() < deadline, f"stuck at {await reward_count(bus)} of {want} rewards"
        await asyncio.sleep(0.05)


async def records(bus: Bus, durable: str) -> list[dict[str, Any]]:
    kv = await bus.js.key_value(bucket_name(durable))
    return [orjson.loads((await kv.get(k)).value) for k in await kv_keys(kv)]


def per_version(got: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
    return Counter((d["trajectory_id"], int(d["metadata"]["version"])) for d in got)


@pytest.mark.parametrize("one_data_dir", [False, True], ids=["two-machines", "one-data-dir"])
async def test_two_replicas_one_sigkilled_mid_batch(
    server: EmbeddedNats, tmp_path: Path, one_data_dir: bool
) -> None:
    """As on two machines (a data dir each), and as two replicas on one machine that were
    given the same data dir (one SQLite cache file: they must not corrupt each other)."""
    bus = await fresh_bus(server)
    durable = f"rewards-{uuid.uuid4().hex[:8]}"
    docs = [sample_trajectory(i, trajectory_id=str(uuid.uuid4())) for i in range(1500)]
    procs = await start_replicas(bus, server.url, tmp_path, durable, one_data_dir=one_data_dir)
    events = [TrajectoryEvent.model_validate(d) for d in docs]
    try:
        sent = 1000
        await bus.publish_many(events[:sent])
        await wait_for(bus, procs, 300, tmp_path)
        # Kill "a" only once it has committed work of its own: on a loaded host it can start
        # pulling late, and "b" alone scored the first 300 (CI, 2026-11-27).
        deadline = time.monotonic() + 120
        while "a" not in {r.get("by") for r in await records(bus, durable)}:
            assert time.monotonic() < deadline, "replica a never committed a reward"
            if sent < 1400 and await reward_count(bus) >= sent - 50:  # keep it fed
                await bus.publish_many(events[sent : sent + 100])
                sent += 100
            await asyncio.sleep(0.2)
        procs["a"].send_signal(signal.SIGKILL)  # mid-batch: claims taken, rewards in flight
        procs["a"].wait(10)
        # the rest arrives after the kill, so the survivor always has work left (on a fast
        # host both replicas had scored all 1,500 before the kill: nothing was tested)
        await bus.publish_many(events[sent:])
        await wait_for(bus, procs, 1500, tmp_path)
        deadline = time.monotonic() + 60
        while not await settled(bus, durable):  # the killed replica's batch was redelivered
            assert time.monotonic() < deadline, "the killed replica's trajectories never settled"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # past the 1 s window: a late second copy would be stored
    finally:
        stop(procs)
    got = await read_stream(bus, "RL_REWARDS", "agent.rl.reward.v1")
    counts = per_version(got)
    assert [k for k, n in counts.items() if n > 1] == []  # no duplicate
    assert {tid for tid, _ in counts} == {d["trajectory_id"] for d in docs}  # none missing
    assert len(got) == 1500
    shared = await records(bus, durable)
    await bus.close()
    assert {r["by"] for r in shared} == {"a", "b"}  # both replicas did part of the work


async def test_a_retry_that_reaches_the_other_replica_is_not_rewarded_twice(
    server: EmbeddedNats, tmp_path: Path
) -> None:
    """A producer publishes its trajectories again past the duplicate window (other
    message ids): about half the copies reach the replica that did not score them, whose
    own data dir knows nothing of them."""
    bus = await fresh_bus(server)
    durable = f"rewards-{uuid.uuid4().hex[:8]}"
    docs = [sample_trajectory(i, trajectory_id=str(uuid.uuid4())) for i in range(300)]
    procs = await start_replicas(bus, server.url, tmp_path, durable)
    try:
        await bus.publish_many([TrajectoryEvent.model_validate(d) for d in docs])
        await wait_for(bus, procs, 300, tmp_path)
        await asyncio.sleep(1.5)
        await bus.publish_many(
            [
                ("agent.rl.trajectory.v1", orjson.dumps(d), f"retry-{d['trajectory_id']}")
                for d in docs
            ]
        )
        deadline = time.monotonic() + 60
        while not await settled(bus, durable):
            assert time.monotonic() < deadline, "the consumers never settled"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)
    finally:
        stop(procs)
    got = await read_stream(bus, "RL_REWARDS", "agent.rl.reward.v1")
    assert len(got) == 300
    assert set(per_version(got)) == {(d["trajectory_id"], 1) for d in docs}
    await bus.close()
    # Copies did reach the replica that had not scored them (else this tested nothing).
    stats = [(tmp_path / f"{n}.log").read_text() for n in ("a", "b")]
    found = [int(m) for t in stats for m in re.findall(r"'scored_by_another_replica': (\d+)", t)]
    assert sum(found) > 0


async def test_feedback_across_replicas_makes_each_version_once(
    server: EmbeddedNats, tmp_path: Path
) -> None:
    bus = await fresh_bus(server)
    durable = f"rewards-{uuid.uuid4().hex[:8]}"
    docs = [
        sample_trajectory(i, trajectory_id=str(uuid.uuid4()), feedback="none") for i in range(200)
    ]
    early, late = docs[:20], docs[20:70]
    procs = await start_replicas(bus, server.url, tmp_path, durable)

    def feedback(doc: dict[str, Any], kind: str, rating: int | None = None) -> FeedbackEvent:
        return FeedbackEvent(
            trajectory_id=doc["trajectory_id"],
            timestamp="2026-11-25T12:00:00Z",
            type=kind,  # type: ignore[arg-type]
            rating=rating,
        )

    try:
        # Feedback before its trajectory: whichever replica scores it folds it into v1.
        await bus.publish_many([feedback(d, "thumbs_down") for d in early])
        await asyncio.sleep(1.0)
        await bus.publish_many([TrajectoryEvent.model_validate(d) for d in docs])
        await wait_for(bus, procs, 200, tmp_path)
        # Late feedback, then the same feedback again under other message ids.
        late_fb = [feedback(d, "rating", 4) for d in late]
        await bus.publish_many(late_fb)
        await wait_for(bus, procs, 250, tmp_path)
        for fb in late_fb[:10]:
            await bus.publish_raw("agent.rl.feedback.v1", fb.to_json(), f"again-{fb.feedback_id}")
        deadline = time.monotonic() + 60
        while not await settled(bus, durable):
            assert time.monotonic() < deadline, "the consumers never settled"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)
    finally:
        stop(procs)
    got = await read_stream(bus, "RL_REWARDS", "agent.rl.reward.v1")
    await bus.close()
    counts = per_version(got)
    assert [k for k, n in counts.items() if n > 1] == []
    want = {(d["trajectory_id"], 1) for d in docs} | {(d["trajectory_id"], 2) for d in late}
    assert set(counts) == want
    v1 = {d["trajectory_id"]: d for d in got if d["metadata"]["version"] == 1}
    for d in early:  # the early feedback is in version 1, whoever scored it
        assert v1[d["trajectory_id"]]["reward_components"]["user_feedback"]["score"] == 0.0
