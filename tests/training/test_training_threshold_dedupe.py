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


def test_count_rewards_dedupes_by_trajectory_and_version() -> None:
    state = ThresholdState()
    seen: set[tuple[str, int]] = set()
    assert count_rewards(state, [("t5", "a", 1), ("t6", "a", 1)], 3, seen) == []
    # A batch from before (lower stream sequences) comes back: counted, once.
    assert count_rewards(state, [("t1", "a", 1), ("t1", "a", 1)], 3, seen) == [("a", 1)]
    assert count_rewards(state, [("t5", "a", 1), ("t1", "a", 2)], 3, seen) == []
    assert state.counts == {"a": 0} and seen == {("t1", 1), ("t5", 1), ("t6", 1)}


async def test_a_nakked_reward_batch_that_comes_back_is_counted(nats, data_dir):
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    settings = settings_for(data_dir, nats.url)
    ts = make_ts(threshold=8, threshold_scope="agent", devices=[])
    trajs = [trajectory(i, agent="agent-a") for i in range(8)]
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
            await _wait(lambda: len(svc.store.jobs()) == 1, 30)
            job = svc.store.jobs()[0]
            flt = job.request["training_config"]["dataset"]["filter"]
            assert flt["agent_ids"] == ["agent-a"]
            assert svc.counters["threshold_triggers"] == 1
    finally:
        await bus.close()
