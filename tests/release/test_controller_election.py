"""Two deployment controllers on one registry (real processes, a real nats-server): one is
active, elected through a KV lease; the standby takes over within seconds when the active one
dies in the middle of a rollout (here: stopped dead between the writes of a promotion, then
SIGKILLed), finishes it from the registry alone, and no decision is recorded twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from test_release_actions import (  # noqa: F401 - env and live are fixtures
    BY,
    Env,
    Live,
    env,
    feed_until,
    live,
    plan,
    publish_rewards,
)

CHILD = Path(__file__).with_name("release_child.py")
TTL_S = 2.0


class Replica:
    def __init__(self, e: Env, tmp: Path, owner: str, the_plan: str, pause_at: str | None) -> None:
        self.owner = owner
        self.marker = tmp / f"paused-{owner}"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("AGENTRL_DEPLOY_PAUSE")}
        if pause_at:
            environ["AGENTRL_DEPLOY_PAUSE_AT"] = pause_at
            environ["AGENTRL_DEPLOY_PAUSE_FILE"] = str(self.marker)
        self.log = tmp / f"{owner}.log"
        args = [e.url, e.bucket, e.public, str(tmp / owner), the_plan, owner, str(TTL_S)]
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, str(CHILD), *args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=environ,
            )

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


async def _holder(e: Env, public: str) -> str | None:
    from agentrl.bus.lease import holder, lease_bucket

    kv = await lease_bucket(e.bus.js, TTL_S)
    return await holder(kv, f"deploy.{public}.controller")


async def test_standby_takes_over_a_rollout_when_the_active_controller_dies(
    env: Env,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    e, v1 = env, env.candidate
    # three steps; every check passes once both sides have min_samples
    p = plan(weights=(20.0, 50.0, 100.0), pause=0.3, max_reward_drop=1.0, max_error_increase=1.0)
    await e.deployer.start(v1, p, by="test")
    a = Replica(e, tmp_path, f"ctl-a-{uuid.uuid4().hex[:4]}", p.model_dump_json(), "promote:split")
    b: Replica | None = None
    try:

        async def a_leads() -> bool:
            assert a.proc.poll() is None, a.output()
            return await _holder(e, e.public.replace(".", "_")) == a.owner

        await feed_until(e, {}, a_leads, 60)
        b = Replica(e, tmp_path, f"ctl-b-{uuid.uuid4().hex[:4]}", p.model_dump_json(), None)

        async def a_stopped_mid_promote() -> bool:
            assert a.proc.poll() is None, a.output()
            assert b is not None and b.proc.poll() is None, b.output()
            return a.marker.exists()

        # the active one ramps (b stands by), then stops dead between two promote writes
        await feed_until(e, {e.base: 0.8, v1: 0.8}, a_stopped_mid_promote, 120)
        rollout = await e.registry.get_rollout(e.public)
        assert rollout is not None and rollout.status == "promoting"
        a.kill()
        killed = time.monotonic()

        took: list[float] = []

        async def promoted() -> bool:
            assert b is not None and b.proc.poll() is None, b.output()
            if not took and await _holder(e, e.public) == b.owner:
                took.append(time.monotonic() - killed)
            r = await e.registry.get_rollout(e.public)
            return r is not None and r.status == "promoted"

        await feed_until(e, {}, promoted, 60)
        failover_s = time.monotonic() - killed
        print(f"controller failover: {failover_s:.1f}s, lease after {took} (TTL {TTL_S}s)")
        # a's lease was renewed last before it stopped dead: b acted within a few TTLs
        assert failover_s < TTL_S + 10
        assert await _holder(e, e.public.replace(".", "_")) == b.owner
    finally:
        a.kill()
        if b is not None:
            b.kill()
    record = await e.registry.require_model(v1)
    assert record.state == "live"
    decisions = [
        (d.action, d.evidence.get("step"), d.evidence.get("deployment_id"))
        for d in record.decisions
        if d.action in ("advance", "promote", "rollback", "set_weight", "escalate")
    ]
    twice = {k: n for k, n in Counter(decisions).items() if n > 1}
    assert not twice, json.dumps(
        [(d.action, d.by, d.reason, d.evidence.get("step")) for d in record.decisions], indent=1
    )
    actions = [d.action for d in record.decisions]
    assert actions.count("promote") == 1 and actions.count("advance") == 2, actions
    assert actions.count("set_weight") == 3, actions


@pytest.mark.plan(plan(pause=0.0, max_reward_drop=1.0, max_error_increase=1.0))
async def test_an_advance_recorded_by_a_controller_that_died_is_not_recorded_again(
    env: Env,  # noqa: F811 - the fixture
    live: Live,  # noqa: F811 - the fixture
) -> None:
    """The active controller recorded "advance" and died before moving the rollout: its
    successor moves it without a second "advance" in the audit trail."""
    e, v1, d = env, env.candidate, live.d
    rollout = await e.deployer.start(v1, d.controller.plan, by="test")
    for v in (e.base, v1):
        d.state.stats_for(v)
    await d.controller.tick()  # the baseline of the gateway's counters
    for v in (e.base, v1):
        d.state.stats[v].requests += 10
    await publish_rewards(e.bus, e.base, [0.8] * 6)
    await publish_rewards(e.bus, v1, [0.8] * 6)
    await d.manager.sync(force=True)  # a gateway serves v1 and says so
    await e.registry.record(
        v1,
        by=BY,
        action="advance",
        reason="step 1 held; pass (recorded by a controller that died next)",
        evidence={"deployment_id": rollout.deployment_id, "step": 0},
    )
    await asyncio.sleep(0.5)
    assert await d.controller.tick() == "advance"
    now = await e.registry.get_rollout(e.public)
    assert now is not None and now.step == 1
    actions = [x.action for x in (await e.registry.require_model(v1)).decisions]
    assert actions.count("advance") == 1, actions
