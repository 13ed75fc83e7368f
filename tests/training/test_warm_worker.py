"""AGENTRL_TRAINING_WARM_WORKER: a job process started ahead (torch imported) runs the next
job as a fresh process would (its log, its status events, cancel by SIGTERM); a spare that
died while waiting is replaced by a fresh start; the service's stop ends the spare."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import psutil
from training_helpers import (
    Statuses,
    publish_data,
    running_service,
    settings_for,
    trajectory,
    tsettings,
)

from agentrl.bus import Bus
from agentrl.training.requests import fill_request


async def _wait(cond, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.05)


def _job_pid(svc, job_id: str) -> int:
    events = svc.root / "jobs" / job_id / "events.jsonl"
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("phase") == "starting":
            return int(ev["pid"])
    raise AssertionError("no starting event")


def _torch_imported(pid: int) -> bool:
    """The process has torch's shared library mapped: its import is done."""
    try:
        return any("libtorch" in m.path for m in psutil.Process(pid).memory_maps())
    except psutil.Error:
        return False


async def test_jobs_run_in_the_spare_started_ahead_and_a_dead_spare_is_replaced(
    nats, data_dir: Path
) -> None:
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    statuses = await Statuses().start(bus)
    ts = tsettings(
        warm_worker=True, batch_size=4, save_interval=1000, sample_size=8, holdout_size=0.0
    )
    await publish_data(
        bus, [trajectory(i, task=f"t{i // 4}") for i in range(8)], [(i % 4) / 3 for i in range(8)]
    )
    try:
        async with running_service(bus, settings_for(data_dir, nats.url), ts) as svc:
            await _wait(lambda: svc.spare is not None and svc.spare.proc is not None, 30)
            first_spare = svc.spare.proc.pid
            # torch is imported before any job exists
            await _wait(lambda: _torch_imported(first_spare), 120)
            req = fill_request({"training_config": {"base_model": "tiny"}}, ts)
            await bus.publish(req)
            # the next spare is started at the hand-over; it dies before the next job comes:
            # killed at once here (its torch import would be ~5 CPU-s of the suite for a
            # process the test kills anyway). The next job starts a fresh process and still
            # completes.
            await _wait(
                lambda: svc.spare.proc is not None and svc.spare.proc.pid != first_spare, 60
            )
            second_spare = svc.spare.proc.pid
            os.kill(second_spare, signal.SIGKILL)
            done = await statuses.wait(req.training_job_id, ("completed", "failed"), 120)
            assert done["status"] == "completed", done
            assert _job_pid(svc, req.training_job_id) == first_spare
            assert svc.counters["spare_jobs"] == 1
            log = svc.root / "jobs" / req.training_job_id / "job.log"
            assert "checkpoint written" in log.read_text()
            assert (svc.root / "jobs" / req.training_job_id / "process.log").exists()
            assert svc.spare.proc.pid == second_spare != first_spare
            await _wait(lambda: svc.spare.proc.returncode is not None, 10)
            req2 = fill_request({"training_config": {"base_model": "tiny"}}, ts)
            await bus.publish(req2)
            done2 = await statuses.wait(req2.training_job_id, ("completed", "failed"), 120)
            assert done2["status"] == "completed", done2
            assert _job_pid(svc, req2.training_job_id) not in (first_spare, second_spare)
            assert svc.counters["spare_jobs"] == 1
            third_spare = svc.spare.proc.pid
            assert psutil.pid_exists(third_spare)
            # a job in a spare is cancelled as any job is (SIGTERM, stops after its step)
            long = fill_request(
                {"training_config": {"base_model": "tiny", "hyperparameters": {"epochs": 200}}},
                ts,
            )
            await bus.publish(long)
            await _wait(lambda: "running" in statuses.states(long.training_job_id), 60)
            await bus.publish_json(
                "agent.rl.training.cancel.v1",
                {"training_job_id": long.training_job_id},
                msg_id=f"c-{long.training_job_id}",
            )
            cancelled = await statuses.wait(
                long.training_job_id, ("cancelled", "completed", "failed"), 60
            )
            assert cancelled["status"] == "cancelled", cancelled
            assert _job_pid(svc, long.training_job_id) == third_spare
            last_spare = svc.spare.proc.pid
        # the service's stop ends the spare
        await _wait(lambda: not psutil.pid_exists(last_spare) or _zombie(last_spare), 10)
    finally:
        await bus.close()


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
