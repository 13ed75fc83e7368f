"""The training service when NATS goes away: a real nats-server stopped for longer than the
bus's publish retry window while a job ends. The scheduler must survive (the next request
starts), the final status must reach the stream and the KV once NATS is back, also when the
service itself stops between the SQLite commit and the publish (status outbox), and an inner
task that dies must end `run()` so the stack's supervisor restarts it and shows the error."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

from training_helpers import publish_data, running_service, settings_for, trajectory, tsettings

from agentrl.bus import Bus
from agentrl.training.dataset import read_subject
from agentrl.training.kv import read_status
from agentrl.training.requests import fill_request
from agentrl.training.service import TrainingService

FINAL = ("completed", "failed", "cancelled")


async def _bus(nats: Any, data_dir: Any) -> Bus:
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    # A short publish retry window (about 1.5 s instead of about 50 s) so the outage is
    # longer than it without a long test.
    bus.publish_retries = 2
    bus.publish_timeout = 0.5
    return bus


async def _wait(cond: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not await _call(cond):
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.1)


async def _call(cond: Any) -> bool:
    value = cond()
    if asyncio.iscoroutine(value):
        value = await value
    return bool(value)


async def _status(bus: Bus, job_id: str) -> str | None:
    current = await read_status(bus.js, job_id)
    return current["status"] if current else None


async def _stream_statuses(bus: Bus, job_id: str) -> list[str]:
    raw = await read_subject(bus.js, "RL_TRAINING", "agent.rl.training.status.v1")
    events = [json.loads(m) for m in raw]
    return [e["status"] for e in events if e["training_job_id"] == job_id]


# a job the tests SIGKILL while it runs: long enough never to end first (a tiny job forked
# from the suite's launcher can end within the seconds NATS is down: ProcessLookupError at
# load 1, 2026-11-30)
LONG_JOB = {"training_config": {"base_model": "tiny", "hyperparameters": {"epochs": 200}}}


async def _kill_jobs_while_nats_is_down(svc: TrainingService, nats: Any, *job_ids: str) -> None:
    """Stop nats-server, then end the running jobs (SIGKILL: failed INFRA) and wait past the
    publish retry window, so no final status can be published. A job whose lease goes
    unrenewed for its TTL is stopped by the service itself ("moved", not "failed"): the
    kills come at once, and a test with two jobs gives its service a TTL longer than its
    NATS outage (with 10 s and one job's end handled first, the other was fenced at load 1)."""
    for job_id in job_ids:
        await _wait(lambda j=job_id: j in svc.running, 60)
    nats.stop()
    for job_id in job_ids:
        os.kill(svc.running[job_id].proc.pid, signal.SIGKILL)
    for job_id in job_ids:
        await _wait(lambda j=job_id: j not in svc.running, 30)
        assert svc.store.get(job_id).status == "failed"
    await asyncio.sleep(4.0)  # longer than the retry window: every publish attempt failed


async def test_scheduler_survives_nats_down_while_a_job_ends(nats, data_dir):
    bus = await _bus(nats, data_dir)
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(
        devices=["cpu", "cpu"], batch_size=2, save_interval=1000, sample_size=40, holdout_size=0.0
    )
    await publish_data(
        bus, [trajectory(i, task=f"t{i // 4}") for i in range(40)], [(i % 4) / 3 for i in range(40)]
    )
    try:
        async with running_service(bus, settings, ts, lease_ttl_s=60.0) as svc:
            first, other = (fill_request(LONG_JOB, ts) for _ in range(2))
            await bus.publish(first)
            await bus.publish(other)
            # Both end while NATS is away: the scheduler keeps polling, and both ends are
            # committed.
            await _kill_jobs_while_nats_is_down(
                svc, nats, first.training_job_id, other.training_job_id
            )
            nats.start()
            # The final statuses reach the stream and the KV once NATS is back ...
            for job in (first, other):
                await _wait(lambda j=job: _status_is(bus, j.training_job_id, "failed"), 60)
                assert (await _stream_statuses(bus, job.training_job_id))[-1] == "failed"
            # ... and the next request starts.
            second = fill_request({"training_config": {"base_model": "tiny"}}, ts)
            await bus.publish(second)
            await _wait(lambda: svc.store.get(second.training_job_id) is not None, 30)
            await _wait(lambda: svc.store.get(second.training_job_id).status != "queued", 30)
            await _wait(lambda: _status_is(bus, second.training_job_id, "running", *FINAL), 30)
            assert svc.counters["scheduler_errors"] >= 1  # counted and logged, not fatal
    finally:
        await bus.close()


async def _status_is(bus: Bus, job_id: str, *states: str) -> bool:
    return await _status(bus, job_id) in states


async def test_final_status_survives_a_stop_between_commit_and_publish(nats, data_dir):
    bus = await _bus(nats, data_dir)
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(batch_size=2, save_interval=1000, sample_size=40, holdout_size=0.0)
    await publish_data(
        bus, [trajectory(i, task=f"t{i // 4}") for i in range(40)], [(i % 4) / 3 for i in range(40)]
    )
    try:
        req = fill_request(LONG_JOB, ts)
        # a TTL longer than the outage: under load the killed job's end was handled after its
        # lease's 10 s and the service fenced it first ("moved", 2026-12-01, the suite at load 2)
        async with running_service(bus, settings, ts, lease_ttl_s=60.0) as svc:
            await bus.publish(req)
            await _kill_jobs_while_nats_is_down(svc, nats, req.training_job_id)
        # The service stopped with the final status committed but not published.
        nats.start()
        assert await _status(bus, req.training_job_id) == "running"
        async with running_service(bus, settings, ts):
            await _wait(lambda: _status_is(bus, req.training_job_id, "failed"), 30)
        assert (await _stream_statuses(bus, req.training_job_id))[-1] == "failed"
    finally:
        await bus.close()


class _BrokenCron(TrainingService):
    """A service whose schedule trigger raises (a bug in one inner task)."""

    async def _cron(self, stop: asyncio.Event) -> None:
        raise RuntimeError("cron exploded")


async def test_a_dead_inner_task_ends_run_and_the_supervisor_shows_it(nats, data_dir):
    from agentrl.app.stack import ServiceHealth, supervise

    bus = await _bus(nats, data_dir)
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(schedule="0 2 * * *")
    health = ServiceHealth("training service")
    stop = asyncio.Event()

    async def serve(bus: Bus, stop: asyncio.Event, settings: Any) -> None:
        await _BrokenCron(bus, settings, ts).run(stop)

    task = asyncio.create_task(supervise("training", serve, bus, stop, settings, health, (0.2,)))
    try:
        await _wait(lambda: health.restarts >= 2, 30)
        assert health.last_error is not None and "cron exploded" in health.last_error
        assert "training-cron" in health.last_error
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close()
