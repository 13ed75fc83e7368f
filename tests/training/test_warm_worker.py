"""AGENTRL_TRAINING_WARM_WORKER: the service starts a job launcher (torch imported once) and
every job forks from it, running as a fresh process would (its log, its status events,
cancel by SIGTERM); a launcher that died is started again and the job meanwhile starts a
process of its own; the service's stop ends the launcher."""

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


def _job_pid(svc, job_id: str) -> int | None:
    """The pid the job's process reported at its start; None before."""
    events = svc.root / "jobs" / job_id / "events.jsonl"
    for line in events.read_text().splitlines() if events.exists() else []:
        ev = json.loads(line)
        if ev.get("phase") == "starting":
            return int(ev["pid"])
    return None


async def test_jobs_fork_from_the_launcher_and_a_dead_launcher_is_started_again(
    nats, data_dir: Path, no_launcher: None
) -> None:
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    statuses = await Statuses().start(bus)
    ts = tsettings(
        warm_worker=True, batch_size=4, save_interval=1000, sample_size=8, holdout_size=0.0
    )
    assert ts.launcher is None
    await publish_data(
        bus, [trajectory(i, task=f"t{i // 4}") for i in range(8)], [(i % 4) / 3 for i in range(8)]
    )

    async def run_one() -> str:
        req = fill_request({"training_config": {"base_model": "tiny"}}, ts)
        await bus.publish(req)
        done = await statuses.wait(req.training_job_id, ("completed", "failed"), 120)
        assert done["status"] == "completed", done
        return req.training_job_id

    try:
        async with running_service(bus, settings_for(data_dir, nats.url), ts) as svc:
            launcher = svc.own_launcher
            assert launcher is not None
            await _wait(lambda: launcher.alive, 30)
            first = launcher.proc.pid
            # a job forked from the launcher (that one launcher forks job after job: the new
            # launcher's two jobs below; a third job here cost ~2 CPU-s)
            job_id = await run_one()
            pid = _job_pid(svc, job_id)
            assert pid is not None and pid != first and not psutil.pid_exists(pid)
            assert svc.counters["forked_jobs"] == 1
            assert "checkpoint written" in (svc.root / "jobs" / job_id / "job.log").read_text()
            assert launcher.proc.pid == first
            # the launcher dies: the next job starts a process of its own, the launcher is
            # started again, and the job after forks from the new one
            os.kill(first, signal.SIGKILL)
            await _wait(lambda: launcher.proc.returncode is not None, 10)
            await run_one()
            assert svc.counters["forked_jobs"] == 1
            second = launcher.proc.pid
            assert second != first and launcher.alive
            job_id = await run_one()
            assert svc.counters["forked_jobs"] == 2
            pid = _job_pid(svc, job_id)
            assert pid is not None and pid != second and not psutil.pid_exists(pid)
            assert "checkpoint written" in (svc.root / "jobs" / job_id / "job.log").read_text()
            # a forked job is cancelled as any job is (SIGTERM, stops after its step)
            long = fill_request(
                {"training_config": {"base_model": "tiny", "hyperparameters": {"epochs": 200}}},
                ts,
            )
            await bus.publish(long)
            await _wait(lambda: _job_pid(svc, long.training_job_id) is not None, 60)
            pid = _job_pid(svc, long.training_job_id)  # the launcher's child, its own session
            assert pid is not None
            assert psutil.Process(pid).ppid() == second and os.getsid(pid) == pid
            assert launcher.proc.pid == second  # the same launcher forked its second job
            await bus.publish_json(
                "agent.rl.training.cancel.v1",
                {"training_job_id": long.training_job_id},
                msg_id=f"c-{long.training_job_id}",
            )
            cancelled = await statuses.wait(
                long.training_job_id, ("cancelled", "completed", "failed"), 60
            )
            assert cancelled["status"] == "cancelled", cancelled
            assert svc.counters["forked_jobs"] == 3
        # the service's stop ends the launcher
        await _wait(lambda: not psutil.pid_exists(second) or _zombie(second), 10)
    finally:
        await bus.close()


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
