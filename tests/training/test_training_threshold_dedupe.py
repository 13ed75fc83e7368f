"""Per-agent threshold counting de-duplicates by (trajectory_id, version): a reward batch that
was nakked (its trajectories not indexed yet) and comes back after later rewards were counted
is counted too (8 rewarded trajectories, 8 counted, the trigger fires at 8)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from training_helpers import publish_raw, reward, running_service, settings_for, trajectory
from training_helpers import tsettings as make_ts

from agentrl.bus import Bus
from agentrl.training.triggers import ThresholdState, count_rewards


async def _wait(cond: Any, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def _eight_trajectories_of_one_agent(nats: Any, data_dir: Any) -> tuple[Any, ...]:
    """A bus with the streams, the service's settings (a threshold of 8 per agent) and 8
    trajectories of agent-a."""
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    settings = settings_for(data_dir, nats.url)
    ts = make_ts(threshold=8, threshold_scope="agent", devices=[])
    return bus, settings, ts, [trajectory(i, agent="agent-a") for i in range(8)]


def test_count_rewards_dedupes_by_trajectory_and_version() -> None:
    state = ThresholdState()
    seen: set[tuple[str, int]] = set()
    assert count_rewards(state, [("t5", "a", 1), ("t6", "a", 1)], 3, seen) == []
    # A batch from before (lower stream sequences) comes back: counted, once.
    assert count_rewards(state, [("t1", "a", 1), ("t1", "a", 1)], 3, seen) == [("a", 1)]
    assert count_rewards(state, [("t5", "a", 1), ("t1", "a", 2)], 3, seen) == []
    assert state.counts == {"a": 0} and seen == {("t1", 1), ("t5", 1), ("t6", 1)}


async def test_a_nakked_reward_batch_that_comes_back_is_counted(nats, data_dir):
    bus, settings, ts, trajs = await _eight_trajectories_of_one_agent(nats, data_dir)
    early, late = trajs[:5], trajs[5:]
    try:
        async with running_service(bus, settings, ts) as svc:
            # Rewards of trajectories the service has not indexed yet: the batch is nakked.
            await publish_raw(
                bus, "agent.rl.reward.v1", [reward(t, 0.5) for t in early], "reward_id"
            )
            await asyncio.sleep(0.3)
            # Later trajectories and their rewards are counted meanwhile (higher sequences).
            await publish_raw(bus, "agent.rl.trajectory.v1", late, "trajectory_id")
            await _wait(
                lambda: all(svc.store.get_state(f"scope:{t['trajectory_id']}") for t in late)
            )
            await publish_raw(
                bus, "agent.rl.reward.v1", [reward(t, 0.5) for t in late], "reward_id"
            )
            await _wait(
                lambda: (
                    (svc.store.get_state("threshold") or {}).get("counts", {}).get("agent-a") == 3
                )
            )
            # Now the early trajectories arrive; their rewards come back and count.
            await publish_raw(bus, "agent.rl.trajectory.v1", early, "trajectory_id")
            await _wait(lambda: len(svc.store.jobs()) == 1, 60)
            job = svc.store.jobs()[0]
            flt = job.request["training_config"]["dataset"]["filter"]
            assert flt["agent_ids"] == ["agent-a"]
            assert svc.counters["threshold_triggers"] == 1
    finally:
        await bus.close()


async def test_one_lagging_trajectory_does_not_hold_back_its_rewards_batch(nats, data_dir):
    """All 8 rewards wait in the stream before the service starts, so its first fetch holds
    them in one batch: the 3 whose trajectories are indexed count at once, the 5 others are
    nakked alone and count when their trajectories come (none dead-lettered)."""
    bus, settings, ts, trajs = await _eight_trajectories_of_one_agent(nats, data_dir)
    early, late = trajs[:5], trajs[5:]
    try:
        await publish_raw(bus, "agent.rl.trajectory.v1", late, "trajectory_id")
        await publish_raw(bus, "agent.rl.reward.v1", [reward(t, 0.5) for t in trajs], "reward_id")
        async with running_service(bus, settings, ts) as svc:
            await _wait(
                lambda: (
                    (svc.store.get_state("threshold") or {}).get("counts", {}).get("agent-a") == 3
                ),
                60,
            )
            assert not svc.store.jobs()
            await publish_raw(bus, "agent.rl.trajectory.v1", early, "trajectory_id")
            await _wait(lambda: len(svc.store.jobs()) == 1, 60)
            assert svc.counters["threshold_triggers"] == 1
        assert await bus.dead_letters() == []
    finally:
        await bus.close()
