"""A training runner cut off from NATS (a one-sided partition through a real TCP proxy) stops
its job once its lease's TTL passed unrenewed, before another runner can take the job; the
stale runner's status writes and its job process's checkpoint writes are refused by the
lease revision (the fencing token). Two runners of one name are two lease owners."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from training_helpers import Statuses, publish_data, settings_for, trajectory, tsettings

from agentrl.bus import Bus
from agentrl.core.errors import TrainingError
from agentrl.core.settings import Settings
from agentrl.llm.fence import FENCE_ENV, FENCE_FILE, read_fence
from agentrl.training.requests import fill_request
from agentrl.training.service import TrainingService
from tcp_proxy import TcpProxy

LEASE_TTL_S = 3.0


async def _bus(url: str, data_dir: Path) -> Bus:
    bus = await Bus.connect(url, settings=Settings(data_dir=data_dir, nats_url=url))
    await bus.ensure_streams()
    return bus


async def _wait(cond: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def _running_on(statuses: Statuses, job_id: str, runner: str, step: int = 0) -> bool:
    return any(
        e["status"] == "running"
        and e["metadata"].get("runner") == runner
        and (e.get("progress") or {}).get("current_step", 0) >= step
        for e in statuses.of(job_id)
    )


class Runner:
    """A training service in this process, on its own bus."""

    def __init__(self, bus: Bus, settings: Settings, ts: Any, name: str) -> None:
        self.bus = bus
        self.service = TrainingService(
            bus, settings, ts, replica_id=name, lease_ttl_s=LEASE_TTL_S, scan_s=0.2
        )
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.service.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 60)
        await self.bus.close()


@pytest.mark.slow
async def test_a_runner_cut_off_from_nats_stops_its_job_and_its_writes_are_fenced(nats, data_dir):
    host, port = nats.url.rsplit("//", 1)[1].split(":")
    proxy = await TcpProxy(host, int(port)).start()
    bus = await _bus(nats.url, data_dir)
    statuses = await Statuses().start(bus)
    ts = tsettings(batch_size=2, save_interval=1, sample_size=200)
    await publish_data(
        bus,
        [trajectory(i, task=f"t{i // 4}") for i in range(200)],
        [(i % 4) / 3 for i in range(200)],
    )
    settings = settings_for(data_dir, nats.url)
    a = Runner(await _bus(proxy.url, data_dir), settings, ts, "runner-a")
    b: Runner | None = None
    try:
        req = fill_request({"training_config": {"base_model": "tiny"}}, ts)
        await bus.publish(req)
        job_id = req.training_job_id
        await _wait(lambda: _running_on(statuses, job_id, "runner-a", 2), 180)
        b = Runner(await _bus(nats.url, data_dir), settings, ts, "runner-b")
        job_a = a.service.running[job_id]
        token_a = a.service.job_leases[job_id].token
        storage = a.service._storage_path(job_a.row)

        proxy.cut()  # runner A (and its job process) hear nothing more from NATS
        cut_at = time.monotonic()
        await _wait(lambda: job_a.proc.returncode is not None, 3 * LEASE_TTL_S)
        stopped_after = time.monotonic() - cut_at
        # B takes the job only once the server let A's lease expire; A stopped before
        await _wait(lambda: _running_on(statuses, job_id, "runner-b"), 120)
        took_after = time.monotonic() - cut_at
        print(f"A stopped its job {stopped_after:.1f}s after the cut, B took it {took_after:.1f}s")
        assert stopped_after <= LEASE_TTL_S + 1.0, stopped_after
        assert a.service.counters["leases_expired"] == 1
        assert proxy.dropped > 0, "A tried to renew through the cut"
        # the checkpoint folder's fence is B's, newer than A's token
        fs_fence = read_fence(*_fs(storage))
        assert fs_fence is not None and fs_fence["owner"] == b.service.owner
        assert fs_fence["token"] > token_a

        proxy.heal()  # A is back: what it still has to say about the job is stale
        stale = a.service.build_status(job_id, "failed", error={"code": "INFRA", "message": "x"})
        data = orjson.loads(stale.to_json())
        data["metadata"]["lease_revision"] = token_a  # written while A held the lease
        row = (f"stale-{job_id}", stale.SUBJECT, orjson.dumps(data))
        a.service.store.update(job_id, outbox=[row])
        a.service.wake.set()  # its scheduler flushes the outbox once NATS answers again
        await _wait(lambda: a.service.store.outbox_size() == 0, 60)
        assert a.service.counters["fenced_writes"] == 1
        kv = await bus.js.key_value("agentrl_training")
        current = json.loads((await kv.get(job_id)).value)
        assert current["metadata"]["runner"] == "runner-b", current
        assert "failed" not in statuses.states(job_id)
        # and the job is still B's to run (A did not take it out of the queue)
        from agentrl.training.queue import JobQueue

        assert await JobQueue(await bus.js.key_value("agentrl_training_queue")).get(job_id)
    finally:
        if b is not None:
            await b.close()
        await a.close()
        await proxy.close()
        await bus.close()


def _fs(storage: str) -> tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(storage)


def test_a_stale_job_process_cannot_write_or_rotate_checkpoints(tmp_path, monkeypatch):
    from agentrl.llm.checkpoint import MANIFEST, CheckpointManager

    storage = tmp_path / "ckpt" / "job-1"
    local = tmp_path / "local"
    local.mkdir()
    (local / "weights.safetensors").write_bytes(b"w")
    (local / MANIFEST).write_text(json.dumps({"files": {}}))
    ckpt = CheckpointManager(str(storage), max_checkpoints=1)
    monkeypatch.setenv(FENCE_ENV, json.dumps({"owner": "runner-a-1", "token": 7}))
    (storage).mkdir(parents=True)
    (storage / FENCE_FILE).write_text(json.dumps({"owner": "runner-a-1", "token": 7}))
    ckpt.put(local, "step-00000001")  # our own fence: written
    ckpt.put(local, "step-00000002")
    assert ckpt.list_steps() == ["step-00000001", "step-00000002"]
    # another runner took the job (its token is newer): nothing of ours lands any more
    (storage / FENCE_FILE).write_text(json.dumps({"owner": "runner-b-2", "token": 9}))
    with pytest.raises(TrainingError, match="runner-b-2 owns this job"):
        ckpt.put(local, "step-00000003")
    assert not (storage / "step-00000003").exists()
    with pytest.raises(TrainingError, match="refused"):
        ckpt.put(local, "best")
    with pytest.raises(TrainingError, match=r"rotating checkpoints .* refused"):
        ckpt.rotate()
    assert ckpt.list_steps() == ["step-00000001", "step-00000002"]
    # the new owner (its token in the environment) writes and rotates
    monkeypatch.setenv(FENCE_ENV, json.dumps({"owner": "runner-b-2", "token": 9}))
    ckpt.put(local, "step-00000003")
    assert ckpt.rotate() == ["step-00000001", "step-00000002"]


async def test_two_runners_of_one_name_are_two_lease_owners(nats, data_dir):
    """Same host, same data dir, no replica id: the name is the same, the owners are not,
    so one job's lease goes to one of them."""
    from agentrl.bus.lease import Lease, lease_bucket

    bus = await _bus(nats.url, data_dir)
    try:
        settings = settings_for(data_dir, nats.url)
        one = TrainingService(bus, settings, tsettings(), lease_ttl_s=LEASE_TTL_S)
        two = TrainingService(bus, settings, tsettings(), lease_ttl_s=LEASE_TTL_S)
        one.store.close()
        two.store.close()
        assert one.name == two.name and one.owner != two.owner
        kv = await lease_bucket(bus.js, LEASE_TTL_S)
        first = Lease(kv, "job.same", one.owner, LEASE_TTL_S)
        second = Lease(kv, "job.same", two.owner, LEASE_TTL_S)
        assert await first.acquire()
        assert not await second.acquire()
    finally:
        await bus.close()


@pytest.mark.slow
async def test_a_runner_held_up_past_its_ttl_keeps_a_job_nobody_took(nats, data_dir):
    """A busy host: the runner's event loop is blocked longer than the lease's TTL (no
    renewal could run), but NATS is reachable and no other runner took the job. The job
    goes on (the lease is renewed at once, by compare-and-set) instead of being killed
    and started again; seen in the main job at load 26."""
    bus = await _bus(nats.url, data_dir)
    statuses = await Statuses().start(bus)
    ts = tsettings(batch_size=2, save_interval=1, sample_size=200)
    await publish_data(
        bus,
        [trajectory(i, task=f"t{i // 4}") for i in range(200)],
        [(i % 4) / 3 for i in range(200)],
    )
    a = Runner(await _bus(nats.url, data_dir), settings_for(data_dir, nats.url), ts, "runner-a")
    try:
        req = fill_request({"training_config": {"base_model": "tiny"}}, ts)
        await bus.publish(req)
        job_id = req.training_job_id
        await _wait(lambda: _running_on(statuses, job_id, "runner-a", 2), 180)
        job = a.service.running[job_id]
        time.sleep(LEASE_TTL_S + 1.5)  # the whole event loop held up past the TTL
        await asyncio.sleep(1.0)
        assert a.service.counters["leases_expired"] == 0
        assert a.service.running.get(job_id) is job and job.proc.returncode is None
        assert a.service.job_leases[job_id].held
    finally:
        await a.close()
        await bus.close()
