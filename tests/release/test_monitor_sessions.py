"""The monitor's unit is the session (issue 28.6), one reward per trajectory (28.7), its
evidence survives a restart (28.1) and it never decides on too few sessions (28.2).

The simulation: sticky sessions with their own mean reward (users differ) and their own
activity (some play far more than others) are routed by the real split; their rewards go
through the real `RewardTracker` and `analyse`, looked at after every round of traffic over
a 10 -> 25 -> 50 % ramp. Analysed per reward (the old way) the same traffic rolls identical
versions back far more often than alpha: the simulation is a real stress, not a formality.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from agentrl.bench.bus import sample_trajectory
from agentrl.bus import Bus
from agentrl.contracts.base import utcnow
from agentrl.contracts.reward import RewardEvent
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.release.monitor import RewardTracker, Summary, analyse
from agentrl.serving.config import Analysis
from agentrl.serving.split import choose

ALPHA = 0.05
ANALYSIS = Analysis(reward_range=(0.0, 1.0), min_samples=20, max_reward_drop=0.1, alpha=ALPHA)


def simulate(sessions: int, drop: float, seed: int, per_reward: bool = False) -> str:
    """One rollout's looks: 'fail' at the first failed reward check, else 'nofail'."""
    rng = random.Random(seed)
    mean = [rng.uniform(0.35, 0.95) for _ in range(sessions)]
    activity = [rng.lognormvariate(0.0, 1.0) for _ in range(sessions)]
    keys = [f"run{seed}-session{i}" for i in range(sessions)]
    tracker = RewardTracker(0.0, 1.0)
    k = 0
    for weight in (10.0, 25.0, 50.0):
        # the real split, once per session and weight (it is sticky: a session keeps its
        # version while the weights stay; asked per reward it was a third of the CPU)
        split = {"new": weight, "live": 100 - weight}
        version = [choose(split, ["new", "live"], key, "p") for key in keys]
        for _ in range(10):
            for i in rng.choices(range(sessions), weights=activity, k=max(40, sessions)):
                v = version[i]
                p = mean[i] - (drop if v == "new" else 0.0)
                tracker.add(v, float(rng.random() < p), session=keys[i], trajectory_id=f"t{k}")
                k += 1
            new, live = tracker.sessions("new", 0.0), tracker.sessions("live", 0.0)
            if per_reward:  # every reward an independent draw: the defect
                new = Summary(sessions=new.rewards, session_sum=new.reward_sum)
                live = Summary(sessions=live.rewards, session_sum=live.reward_sum)
            _, checks = analyse(new, live, ANALYSIS)
            if checks[1].verdict == "fail":
                return "fail"
    return "nofail"


@pytest.mark.parametrize("sessions", [20, 50, 200])
def test_identical_versions_are_rolled_back_at_most_alpha_of_the_time(sessions: int) -> None:
    runs = 100 if sessions < 200 else 60
    by_session = sum(simulate(sessions, 0.0, s) == "fail" for s in range(runs)) / runs
    assert by_session <= ALPHA, by_session
    if sessions == 50:  # the same traffic, each reward taken as independent: far above alpha
        by_reward = sum(simulate(sessions, 0.0, s, per_reward=True) == "fail" for s in range(40))
        assert by_reward / 40 > 2 * ALPHA, by_reward


def test_a_canary_0_3_worse_is_detected() -> None:
    found = sum(simulate(200, 0.3, 1000 + s) == "fail" for s in range(20))
    assert found >= 18, found


def test_too_few_sessions_on_either_side_is_inconclusive() -> None:
    def of(values: list[float]) -> Summary:
        return Summary(
            requests=500,
            sessions=len(values),
            session_sum=sum(values),
            session_sumsq=sum(x * x for x in values),
        )

    good, bad = [0.9] * 100, [0.1] * 19
    verdict, checks = analyse(of(bad), of(good), ANALYSIS)
    assert verdict == "inconclusive" and "too few" in checks[1].reason
    verdict, _ = analyse(of(good), of(bad), ANALYSIS)
    assert verdict == "inconclusive"
    verdict, checks = analyse(of([0.1] * 20), of(good), ANALYSIS)
    assert verdict == "fail" and checks[1].verdict == "fail"
    # errors too: fewer than min_samples requests on a side decide nothing
    few = Summary(requests=19, errors=19)
    verdict, checks = analyse(few, Summary(requests=500), ANALYSIS)
    assert checks[0].verdict == "inconclusive"


def test_error_check_with_observed_spread_keeps_alpha_under_peeking() -> None:
    rng = random.Random(3)
    for p in (0.01, 0.2):
        fails = 0
        for _ in range(200):
            a = b = 0
            for n in range(1, 601):
                a += rng.random() < p
                b += rng.random() < p
                if n % 20 == 0:
                    _, checks = analyse(
                        Summary(requests=n, errors=a), Summary(requests=n, errors=b), ANALYSIS
                    )
                    if checks[0].verdict == "fail":
                        fails += 1
                        break
        assert fails / 200 <= ALPHA, (p, fails)
    # and a version without errors is shown no worse after hundreds, not thousands
    _, checks = analyse(Summary(requests=300), Summary(requests=300), ANALYSIS)
    assert checks[0].verdict == "pass"


def reward(tid: str, value: float, model: str | None, version: int = 1, session: str = "s") -> Any:
    meta: dict[str, Any] = {"version": version}
    if model:
        meta["model"] = model
    return RewardEvent.model_validate(
        {
            "trajectory_id": tid,
            "session_id": session,
            "timestamp": utcnow().isoformat(),
            "reward_components": {"task_completion": {"score": value, "weight": 1.0}},
            "total_reward": value,
            "metadata": meta,
        }
    )


def trajectory(tid: str, model: str, served_by: list[str] | None = None) -> TrajectoryEvent:
    data = sample_trajectory(0, turns=1).model_dump(mode="json")
    meta: dict[str, Any] = {"model": model}
    if served_by is not None:
        meta["served_by"] = served_by
    data.update(trajectory_id=tid, session_id="sess-" + tid, metadata=meta)
    return TrajectoryEvent.model_validate(data)


def test_late_feedback_replaces_the_earlier_reward() -> None:
    t = RewardTracker(0.0, 1.0)
    t.on_reward(reward("a", 0.2, "v1"))
    t.on_reward(reward("a", 0.9, "v1", version=2))  # late feedback: replaces
    t.on_reward(reward("a", 0.2, "v1"))  # redelivered v1 after v2: stale
    t.on_reward(reward("a", 0.9, "v1", version=2))  # redelivered v2: the same
    t.on_reward(reward("b", 0.4, "v1", session="s2"))
    assert t.summary("v1", 0.0) == (2, pytest.approx(1.3))
    s = t.sessions("v1", 0.0)
    assert s.rewards == 2 and s.sessions == 2 and t.replaced == 1


def test_a_trajectory_several_versions_played_is_credited_to_none() -> None:
    t = RewardTracker(0.0, 1.0)
    t.on_trajectory(trajectory("m1", "unknown", served_by=["v1", "v2"]))
    t.on_reward(reward("m1", 1.0, "unknown"))
    t.on_reward(reward("m2", 1.0, "v1"))  # credited by the reward's model ...
    t.on_trajectory(trajectory("m2", "v1", served_by=["v1", "v2"]))  # ... until its trajectory
    t.on_trajectory(trajectory("m3", "v2", served_by=["v2", "v2"]))
    t.on_reward(reward("m3", 0.5, None))  # joined on the trajectory
    assert t.summary("v1", 0.0) == (0, 0.0) and t.summary("v2", 0.0) == (1, 0.5)
    assert t.mixed == 2


async def test_evidence_is_rebuilt_from_the_streams_after_a_restart(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    try:
        tag = uuid.uuid4().hex[:8]
        new, live = f"new-{tag}", f"live-{tag}"
        await bus.publish_many([reward(f"{tag}-old{i}", 1.0, new) for i in range(5)])
        await asyncio.sleep(0.05)
        since = time.time()
        await asyncio.sleep(0.05)
        events: list[Any] = []
        for i in range(30):
            events.append(reward(f"{tag}-n{i}", 0.1, new, session=f"{tag}-s{i}"))
            events.append(reward(f"{tag}-l{i}", 0.9, live, session=f"{tag}-t{i}"))
        for i in range(30):  # late feedback on the first ten canary trajectories
            if i < 10:
                events.append(reward(f"{tag}-n{i}", 0.2, new, version=2, session=f"{tag}-s{i}"))
        # rewards without a model: joined on their trajectory (read back too)
        events.append(trajectory(f"{tag}-j", new))
        events.append(reward(f"{tag}-j", 0.0, None, session=f"{tag}-sj"))
        await bus.publish_many(events)

        before = RewardTracker(0.0, 1.0)  # the process that watched it live ...
        for e in events:
            (before.on_trajectory if isinstance(e, TrajectoryEvent) else before.on_reward)(e)
        after = RewardTracker(0.0, 1.0)  # ... and the restarted one
        read = await after.rebuild(bus, since)
        assert read >= len(events) - 1
        assert after.sessions(new, since) == before.sessions(new, 0.0)
        assert after.sessions(live, since) == before.sessions(live, 0.0)
        s = after.sessions(new, since)
        assert s.sessions == 31 and s.session_sum == pytest.approx(10 * 0.2 + 20 * 0.1)
        verdict, _ = analyse(
            after.sessions(new, since).with_errors(100, 0),
            after.sessions(live, since).with_errors(100, 0),
            ANALYSIS,
        )
        assert verdict == "fail"
        await after.rebuild(bus, since)  # again: nothing counted twice
        assert after.sessions(new, since) == s
    finally:
        await bus.close()


async def test_a_restarted_controller_rolls_back_on_evidence_from_before(
    nats_url: str, tmp_path: Path
) -> None:
    """The controller of a fresh process sees a rollout begun by another one: its first
    look reads the rewards since the rollout began and rolls the worse canary back."""
    from agentrl.core.settings import Settings
    from agentrl.release.service import build
    from agentrl.serving.config import DeploySettings, RolloutPlan, Step

    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    try:
        tag = uuid.uuid4().hex[:8]
        plan = RolloutPlan(
            steps=[Step(weight=50, pause_s=3600), Step(weight=100, pause_s=0)],
            analysis=ANALYSIS.model_copy(update={"period_s": 0.2}),
        )
        deploy = DeploySettings(public_model=f"pol-{tag}", bucket=f"models_{tag}")
        settings = Settings(data_dir=tmp_path)
        first = await build(bus, settings, deploy, validate=None, plan=plan)
        base = await first.deployer.bootstrap("tiny")
        assert base is not None
        cand = await first.deployer.register(
            checkpoint_path="", base_model="tiny", sha256="", serving={}
        )
        await first.deployer.start(cand.model_id, plan, by="test")
        events = []
        for i in range(40):
            events.append(reward(f"{tag}-n{i}", 0.1, cand.model_id, session=f"{tag}-a{i}"))
            events.append(reward(f"{tag}-l{i}", 0.9, base.model_id, session=f"{tag}-b{i}"))
        await bus.publish_many(events)
        # "restart": a new process state (empty tracker); nothing followed the stream live
        second = await build(bus, settings, deploy, validate=None, plan=plan)
        assert second.tracker.summary(cand.model_id, 0.0) == (0, 0.0)
        did = await second.controller.tick()
        assert did == "rollback", did
        record = await second.registry.require_model(cand.model_id)
        assert record.state == "rolled_back"
        check = next(
            c for c in record.decisions[-1].evidence["checks"] if c["metric"] == "mean_reward"
        )
        assert check["verdict"] == "fail" and check["new"]["n"] == 40
    finally:
        await bus.close()


async def test_the_live_follower_keeps_counting_past_a_thousand_rewards(nats_url: str) -> None:
    """The follower's consumer must not wait for acks: one that did stopped delivering at
    `max_ack_pending` (1,000) and every canary after the first stayed undecided."""
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    tracker = RewardTracker(0.0, 1.0)
    stop = asyncio.Event()
    task = asyncio.create_task(tracker.run(bus, stop))
    try:
        await asyncio.sleep(0.5)  # the follower's consumers exist (new messages only)
        tag = uuid.uuid4().hex[:8]
        since = time.time() - 1.0
        events = [reward(f"{tag}-{i}", 0.5, f"v-{tag}", session=f"{tag}-s{i}") for i in range(1500)]
        await bus.publish_many(events)
        deadline = time.monotonic() + 60
        while tracker.sessions(f"v-{tag}", since).sessions < 1500 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert tracker.sessions(f"v-{tag}", since).sessions == 1500
    finally:
        stop.set()
        await task
        await bus.close()
