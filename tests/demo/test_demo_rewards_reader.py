"""Defect 11: the demo read the whole reward stream through a durable consumer it left
behind. `follow_rewards` reads only what is published after it starts, through an
ephemeral consumer that is gone when it returns."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from agentrl.bus import Bus
from agentrl.contracts.reward import RewardEvent
from agentrl.demo.loop import RewardInbox, follow_rewards

SEED = Path(__file__).parents[1] / "contracts" / "data" / "seed_agent.rl.reward.v1.json"


def reward() -> RewardEvent:
    doc = json.loads(SEED.read_text())
    doc["reward_id"] = str(uuid.uuid4())
    doc["trajectory_id"] = str(uuid.uuid4())
    return RewardEvent.model_validate(doc)


async def test_follow_rewards_reads_only_new_rewards_and_leaves_no_consumer(
    nats_url: str,
) -> None:
    bus = await Bus.connect(nats_url)
    try:
        await bus.ensure_streams()
        old = [reward() for _ in range(5)]
        await bus.publish_many(old)
        consumers_before = {c.name for c in await bus.js.consumers_info("RL_REWARDS")}

        inbox, stop, ready = RewardInbox(), asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(follow_rewards(bus, inbox, stop, ready, fetch_timeout=0.2))
        await ready.wait()
        new = [reward() for _ in range(3)]
        await bus.publish_many(new)
        got = await inbox.wait_for([r.trajectory_id for r in new], timeout=20)
        stop.set()
        read = await task

        assert set(got) == {r.trajectory_id for r in new}
        assert not {r.trajectory_id for r in old} & set(inbox.latest)  # no replay
        assert read == 3
        consumers_after = {c.name for c in await bus.js.consumers_info("RL_REWARDS")}
        assert consumers_after == consumers_before  # nothing left behind
    finally:
        await bus.close()
