"""A reward service process killed with SIGKILL mid-stream: after a restart nothing is lost,
no reward id is stored twice, and no trajectory entered the statistics twice.

JetStream's duplicate window is shrunk to one second (after each start, since the service's
ensure_streams() restores the configured 120 s), and the restart waits past it: exactly-once
must come from the service's outbox, not from the server dropping a copy in time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.bench.rewards import read_stream
from agentrl.bus import Bus, EmbeddedNats
from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.rewards.store import RewardStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    srv = EmbeddedNats(data_dir=tmp_path_factory.mktemp("rewards-crash-nats"))
    srv.start()
    yield srv
    srv.stop()


def serve(url: str, data_dir: Path, config: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "rewards",
        "serve",
        "--nats-url",
        url,
        "--data-dir",
        str(data_dir),
    ]
    cmd += ["--config", str(config), "--batch", "64", "--ack-wait", "3"]
    return subprocess.Popen(
        cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "200"}
    )


async def count_rewards(bus: Bus) -> int:
    return int((await bus.js.stream_info("RL_REWARDS")).state.messages)


async def started(bus: Bus, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait for the service's consumer, then shrink the duplicate windows to 1 s."""
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the service never created its consumer"
        try:
            await bus.js.consumer_info("RL_TRAJECTORIES", "rewards")
            break
        except Exception:
            await asyncio.sleep(0.05)
    for stream in ("RL_TRAJECTORIES", "RL_REWARDS"):
        cfg = (await bus.js.stream_info(stream)).config
        cfg.duplicate_window = 1.0
        await bus.js.update_stream(cfg)


async def test_sigkill_mid_stream_then_restart(server: EmbeddedNats, tmp_path: Path) -> None:
    bus = await Bus.connect(server.url)
    await bus.ensure_streams()
    for stream in ("RL_TRAJECTORIES", "RL_REWARDS", "RL_DLQ"):
        await bus.js.purge_stream(stream)
    config = tmp_path / "rewards.yaml"
    config.write_text("window: 5000\n")
    docs = [sample_trajectory(i, trajectory_id=str(uuid.uuid4())) for i in range(1500)]
    log = tmp_path / "service.log"
    proc = serve(server.url, tmp_path / "data", config, log)
    try:
        await started(bus, proc, log)
        for k in range(0, len(docs), 500):
            await bus.publish_many([TrajectoryEvent.model_validate(d) for d in docs[k : k + 500]])
        deadline = time.monotonic() + 90
        while await count_rewards(bus) < 300:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "service produced too few rewards"
            await asyncio.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        at_kill = await count_rewards(bus)
        assert at_kill < 1500, "the kill came too late to test anything"
        await asyncio.sleep(1.5)  # past the 1 s window: a republished copy would be stored
        proc = serve(server.url, tmp_path / "data", config, log)
        await started(bus, proc, log)
        deadline = time.monotonic() + 120
        while await count_rewards(bus) < 1500:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"stuck at {await count_rewards(bus)} rewards"
            await asyncio.sleep(0.05)
    finally:
        if proc.poll() is None:  # SIGTERM drains every publish in flight before exiting
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    got = await read_stream(bus, "RL_REWARDS", "agent.rl.reward.v1")
    await bus.close()
    assert len(got) == 1500
    assert len({d["reward_id"] for d in got}) == 1500
    assert {d["trajectory_id"] for d in got} == {d["trajectory_id"] for d in docs}
    state = RewardStore(tmp_path / "data" / "rewards" / "state.sqlite").load_windows(5000, 1000)
    assert len(state.components["task_completion"]) == 1500  # each trajectory counted once
    assert sum(len(w) for w in state.turns.values()) == 1500
