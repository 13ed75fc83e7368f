"""A canary a small deployment can pass (issue 49): five agents, each playing sessions of 20
episodes. The reward check takes the episodes with a session-clustered variance, so a few
long sessions per version decide; a session count of `min_samples` (20) per version never
came within the deadline, and every canary was rolled back at it.

The simulation routes every episode by the real sticky split over a 10 -> 25 -> 50 -> 100 %
ramp (a passed analysis advances a step), credits it through the real `RewardTracker` and
judges with the real `analyse`; the deadline is 2,000 episodes (100 sessions)."""

from __future__ import annotations

import random
from pathlib import Path

from agentrl.release.monitor import RewardTracker, analyse
from agentrl.release.sequential import Clustered, compare_clustered
from agentrl.serving.config import Analysis
from agentrl.serving.split import choose

ALPHA = 0.05
ANALYSIS = Analysis(reward_range=(0.0, 1.0), min_samples=20, max_reward_drop=0.1, alpha=ALPHA)
DEADLINE = 2000
RAMP = (10.0, 25.0, 50.0, 100.0)


def rollout(drop: float, seed: int, *, agents: int = 5, session_len: int = 20) -> str:
    """'promote', 'rollback' or 'undecided' (held at the deadline)."""
    rng = random.Random(seed)
    means = [rng.uniform(0.35, 0.65) for _ in range(agents)]
    keys = [f"s{seed}-agent{i}-0" for i in range(agents)]
    left = [session_len] * agents
    made = agents
    tracker = RewardTracker(0.0, 1.0)
    step = 0
    # the real split, once per session and step (sticky: a session keeps its version while
    # the weights stay; asked per episode it cost more than the tracker)
    routed: dict[tuple[str, float], str] = {}
    for episode in range(DEADLINE):
        i = rng.randrange(agents)
        w = RAMP[step]
        v = routed.get((keys[i], w), "")
        if not v:
            v = (
                choose({"new": w, "live": 100 - w}, ["new", "live"], keys[i], "p")
                if w < 100
                else "new"
            )
            routed[keys[i], w] = v
        p = means[i] - (drop if v == "new" else 0.0)
        tracker.add(v, float(rng.random() < p), session=keys[i], trajectory_id=f"t{episode}")
        left[i] -= 1
        if left[i] == 0:
            keys[i], left[i], made = f"s{seed}-agent{i}-{made}", session_len, made + 1
        if (episode + 1) % 20:
            continue
        new, live = (tracker.sessions(x, 0.0) for x in ("new", "live"))
        new, live = new.with_errors(new.rewards, 0), live.with_errors(live.rewards, 0)
        verdict, _ = analyse(new, live, ANALYSIS)
        if verdict == "fail":
            return "rollback"
        if verdict == "pass":
            step += 1
            if step == len(RAMP):
                return "promote"
    return "undecided"


def test_identical_versions_are_rolled_back_at_most_alpha_of_the_time() -> None:
    runs = 120
    outcomes = [rollout(0.0, s) for s in range(runs)]
    assert outcomes.count("rollback") / runs <= ALPHA, outcomes.count("rollback")


def test_a_canary_0_3_better_is_promoted_within_the_deadline() -> None:
    runs = 40
    outcomes = [rollout(-0.3, 5000 + s) for s in range(runs)]
    assert outcomes.count("promote") / runs >= 0.9, outcomes


def test_a_canary_0_3_worse_is_never_promoted() -> None:
    runs = 40
    outcomes = [rollout(0.3, 9000 + s) for s in range(runs)]
    assert "promote" not in outcomes, outcomes
    assert outcomes.count("rollback") >= runs // 2, outcomes


def test_long_sessions_are_one_unit_each_not_twenty() -> None:
    """A hundred alike episodes of one session are one session's worth of evidence: two
    sessions per version (0.9 and 0.1 on live, 0.2 and 0.0 on the canary) decide nothing,
    while the same episodes taken as independent would look decided."""
    clustered = Clustered.of([(100, 90.0), (100, 10.0)])
    worse = Clustered.of([(100, 20.0), (100, 0.0)])
    check = compare_clustered(
        "mean_reward",
        worse,
        clustered,
        lo=0.0,
        hi=1.0,
        higher_is_better=True,
        tolerance=0.1,
        min_samples=20,
        min_sessions=2,
    )
    assert check.verdict == "inconclusive", check.reason
    episodes = compare_clustered(
        "mean_reward",
        Clustered.of([(1, 1.0)] * 20 + [(1, 0.0)] * 180),
        Clustered.of([(1, 1.0)] * 100 + [(1, 0.0)] * 100),
        lo=0.0,
        hi=1.0,
        higher_is_better=True,
        tolerance=0.1,
        min_samples=20,
        min_sessions=2,
    )
    assert episodes.verdict == "fail"  # the same means from 200 independent episodes
    one = Clustered.of([(40, 36.0)])
    assert (
        compare_clustered(
            "mean_reward", one, one, lo=0, hi=1, higher_is_better=True, tolerance=0.1
        ).verdict
        == "inconclusive"
    )  # one session per version: never a verdict


async def test_a_held_canary_says_how_much_evidence_it_has_and_its_deadline(
    nats_url: str, tmp_path: Path
) -> None:
    """Through the real controller: a small deployment's canary held at its first step
    records where it stands (episodes and sessions per version) and the deadline rule."""
    from agentrl.bench.canary import one_run
    from agentrl.bus import Bus

    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    try:
        run = await one_run(bus, tmp_path, 0, 5, 0.0, seed=3, cap=60, batch=20, small=True)
    finally:
        await bus.close()
    assert run.outcome == "undecided", run
    assert "holding at 10 % (step 1) while evidence accumulates" in run.reason, run.reason
    assert "episodes in" in run.reason and "sessions" in run.reason
    assert "a verdict needs 20 episodes in 2 sessions per version" in run.reason
    assert "still undecided at" in run.reason and "handed to a human" in run.reason
