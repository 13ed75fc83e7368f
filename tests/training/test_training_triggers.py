"""Triggers: threshold counting (pure), cron with an injected clock through the real service,
including a schedule missed while the service was down, and restarts that must not re-fire."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from training_helpers import Statuses, running_service, settings_for, tsettings

from agentrl.bus import Bus
from agentrl.training.triggers import CronSchedule, ThresholdState, count_rewards


def test_threshold_counts_first_versions_once():
    state = ThresholdState()
    seen: set[tuple[str, int]] = set()
    fired = count_rewards(state, [(f"t{i}", "*", 1) for i in range(1, 5)], 5, seen)
    assert fired == [] and state.counts["*"] == 4
    # Redeliveries and later reward versions do not count.
    items = [("t3", "*", 1), ("t4", "*", 1), ("t5", "*", 2), ("t6", "*", 1)]
    fired = count_rewards(state, items, 5, seen)
    assert fired == [("*", 1)] and state.counts["*"] == 0
    again = ThresholdState.from_json(state.to_json())
    assert count_rewards(again, [("t6", "*", 1)], 5, seen) == [] and again.fired == {"*": 1}


def test_threshold_per_scope():
    state = ThresholdState()
    items = [(f"t{i}", "coding" if i % 2 else "research", 1) for i in range(6)]
    assert count_rewards(state, items, 3, set()) == [("research", 1), ("coding", 1)]


def test_cron_due_collapses_missed_runs():
    now = [datetime(2026, 11, 20, 1, 0, tzinfo=UTC)]
    cron = CronSchedule("0 2 * * *", lambda: now[0])
    assert cron.due(now[0]) is None
    last = now[0]
    now[0] = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)  # three 02:00s passed
    assert cron.due(last) == datetime(2026, 11, 23, 2, 0, tzinfo=UTC)
    with pytest.raises(ValueError):
        CronSchedule("61 * * * *")


async def test_cron_trigger_with_injected_clock_and_missed_schedule(nats, data_dir):
    now = [datetime(2026, 11, 20, 1, 0, tzinfo=UTC)]
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    statuses = await Statuses().start(bus)
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(schedule="0 2 * * *", devices=[])  # no device: jobs stay queued (cheap)
    kw = {"clock": lambda: now[0], "cron_poll_s": 0.05}
    try:
        async with running_service(bus, settings, ts, **kw) as svc:
            await asyncio.sleep(0.3)
            assert svc.store.jobs() == []  # first start: nothing was missed
            now[0] = datetime(2026, 11, 20, 2, 0, 30, tzinfo=UTC)
            await _wait(lambda: len(svc.store.jobs()) == 1)
            first = svc.store.jobs()[0]
            assert first.request["trigger_reason"] == "scheduled"
            await asyncio.sleep(0.3)
            assert len(svc.store.jobs()) == 1  # fires once per schedule time
        now[0] = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)  # down for three schedule times
        async with running_service(bus, settings, ts, **kw) as svc:
            await _wait(lambda: len(svc.store.jobs()) == 2)
            await asyncio.sleep(0.4)
            jobs = svc.store.jobs()
            assert len(jobs) == 2, "a missed schedule runs once, not once per missed time"
            assert "2026-11-23T02:00:00" in jobs[1].request["metadata"]["notes"]
            assert jobs[1].request["metadata"]["previous_training_job"] == first.job_id
            await _wait(lambda: statuses.states(jobs[1].job_id) == ["queued"])
        async with running_service(bus, settings, ts, **kw) as svc:  # restart, same clock
            await asyncio.sleep(0.5)
            assert len(svc.store.jobs()) == 2
    finally:
        await bus.close()


async def _wait(cond, timeout: float = 10.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def test_default_schedule_is_daily_at_two():
    from agentrl.training.settings import TrainingSettings

    s = TrainingSettings()
    assert s.schedule == "0 2 * * *" and s.threshold == 5000
    cron = CronSchedule(s.schedule, lambda: datetime(2026, 11, 23, 5, tzinfo=UTC))
    assert cron.next_after(datetime(2026, 11, 23, 5, tzinfo=UTC)) == datetime(
        2026, 11, 24, 2, tzinfo=UTC
    )


async def test_threshold_backlog_does_not_pile_up_jobs(nats, data_dir):
    """30 rewards with N=10 while the first threshold job is still queued: one job, the
    other firings merge into it; per-domain scope names the domain in the filter."""
    from training_helpers import publish_data, trajectory

    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(threshold=10, threshold_scope="domain", devices=[])
    trajs = [trajectory(i, domain=("coding", "research")[i % 2]) for i in range(40)]
    try:
        await publish_data(bus, trajs, [0.5] * 40)
        async with running_service(bus, settings, ts) as svc:
            await _wait(lambda: len(svc.store.jobs()) == 2, 20)
            await asyncio.sleep(0.5)
            jobs = svc.store.jobs()
            assert len(jobs) == 2, "one job per domain, the backlog merged"
            domains = sorted(
                j.request["training_config"]["dataset"]["filter"]["task_domains"][0] for j in jobs
            )
            assert domains == ["coding", "research"]
            assert all(j.request["trigger_reason"] == "threshold_reached" for j in jobs)
    finally:
        await bus.close()


async def test_threshold_reached_during_a_job_starts_one_job_after_it(nats, data_dir):
    """35 rewards with N=10 while the first job is queued: the firings at 20 and 30 are
    deferred (not piled up, not lost); when that job ends, exactly one follow-up job starts."""
    from training_helpers import publish_data, trajectory

    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(threshold=10, devices=[])  # no device: the first job stays queued
    try:
        await publish_data(bus, [trajectory(i) for i in range(35)], [0.5] * 35)
        async with running_service(bus, settings, ts) as svc:
            await _wait(lambda: len(svc.store.jobs()) == 1, 20)
            await _wait(lambda: bool(svc.store.get_state("threshold_deferred")), 20)
            await asyncio.sleep(0.5)
            assert len(svc.store.jobs()) == 1, "no job piles up while the first is active"
            first = svc.store.jobs()[0]
            assert await svc.cancel(first.job_id)
            await _wait(lambda: len(svc.store.jobs()) == 2, 20)
            await asyncio.sleep(0.5)
            jobs = svc.store.jobs()
            assert len(jobs) == 2, "the deferred firings start one job, not two"
            assert jobs[1].request["trigger_reason"] == "threshold_reached"
            assert svc.store.get_state("threshold_deferred") == {}
    finally:
        await bus.close()


async def test_threshold_max_jobs_caps_the_firings_of_one_run(nats, data_dir):
    """The cap the quick loops set: 35 rewards with N=10 and at most one job. The firings
    while that job is queued are deferred as usual; when it ends, none starts after it."""
    from training_helpers import publish_data, trajectory

    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(threshold=10, threshold_max_jobs=1, devices=[])  # the job stays queued
    try:
        await publish_data(bus, [trajectory(i) for i in range(35)], [0.5] * 35)
        async with running_service(bus, settings, ts) as svc:
            await _wait(lambda: len(svc.store.jobs()) == 1, 20)
            await _wait(lambda: bool(svc.store.get_state("threshold_deferred")), 20)
            first = svc.store.jobs()[0]
            assert await svc.cancel(first.job_id)
            # the deferred firing is dropped (not kept for later), no second job
            await _wait(lambda: svc.store.get_state("threshold_deferred") == {}, 20)
            await asyncio.sleep(0.5)
            assert len(svc.store.jobs()) == 1, "the cap: one job"
            assert svc.counters["threshold_triggers"] == 1
    finally:
        await bus.close()


async def test_threshold_max_jobs_caps_each_key_on_its_own(nats, data_dir):
    """Per domain (as per lineage, the lineage loop's cap): the domain that fires first
    does not use up the other's jobs; each gets its one job, no more."""
    from training_helpers import publish_data, trajectory

    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(threshold=10, threshold_scope="domain", threshold_max_jobs=1, devices=[])
    trajs = [trajectory(i, domain=("coding", "research")[i % 2]) for i in range(60)]
    try:
        await publish_data(bus, trajs, [0.5] * 60)
        async with running_service(bus, settings, ts) as svc:
            await _wait(lambda: len(svc.store.jobs()) == 2, 20)
            for job in svc.store.jobs():
                assert await svc.cancel(job.job_id)
            await _wait(lambda: svc.store.get_state("threshold_deferred") == {}, 20)
            await asyncio.sleep(0.5)
            domains = sorted(
                j.request["training_config"]["dataset"]["filter"]["task_domains"][0]
                for j in svc.store.jobs()
            )
            assert domains == ["coding", "research"], "one job per domain, no more"
            assert svc.fired == {"coding": 1, "research": 1}
    finally:
        await bus.close()
