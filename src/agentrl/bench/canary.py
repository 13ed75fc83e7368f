"""`agentrl bench canary`: does the release path roll back identical canaries, and does it
ever promote a worse one? Simulated traffic through the real parts.

Each run is one rollout (10 -> 25 -> 50 -> 100 %) of a candidate over a live version, on a
real nats-server: the real registry, deployer, controller and its monitor, and the real
serving manager keeping a real gateway state's split in step with the registry. Traffic is
sticky sessions: 20-200 of them active at once (drawn per run), each a user with its own
mean reward (uniform 0.35-0.95) that plays a geometric number of trajectories (mean 8)
before a new session takes its place. Every trajectory is routed by the gateway state's own
`resolve(public name, session key)`, counted as a request of the version that served it, and
rewarded 1 or 0 with the user's probability (0.3 less on a worse canary); the reward goes to
the controller's `RewardTracker`. After every `batch` trajectories the controller looks once
(`tick`) and the serving manager applies its decision.

The small deployment: five agents, each playing sessions of 20 episodes one after the
other (a new session key each time, so the split assigns it afresh), each agent with its own
mean reward (uniform 0.35-0.65, so 0.3 better or worse stays a probability); a look every 20
episodes. Its deadline is a budget of traffic: `small_cap` episodes (2,000 by default: 100
sessions, 20 per agent), the rollout's plan holds on an inconclusive step until then.

Figures (the last line is JSON):
  false_rollback_rate    identical canary rolled back (200 runs by default; <= alpha)
  worse_promoted_rate    canary 0.3 worse promoted (<= 0.01)
  rewards_to_detect_p50  rewards per version (the canary's) until a 0.3-worse one is rolled back
  lost                   rewards given that the monitor did not count (0)
  small_false_rollback_rate   small deployment, identical canary rolled back (<= 0.05)
  small_worse_promoted_rate   small deployment, canary 0.3 worse promoted (<= 0.01)
  small_better_promoted_rate  small deployment, canary 0.3 better promoted within the
                              deadline (>= 0.9)
Runs still undecided at the cap (held: neither promoted nor rolled back) are counted apart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.bench.options import CanaryBench

ALPHA = 0.05
DROP = 0.3
SMALL_AGENTS = 5
SMALL_SESSION = 20  # episodes per session
SMALL_BATCH = 20  # episodes between two looks


@dataclass
class Run:
    sessions: int
    drop: float
    small: bool = False
    outcome: str = "undecided"  # promote | rollback | undecided
    canary_rewards: int = 0
    live_rewards: int = 0
    trajectories: int = 0
    uncounted: int = 0
    ticks: int = 0
    reason: str = ""


@dataclass
class Traffic:
    """Sticky sessions, each with its own mean reward, replaced as they end."""

    rng: random.Random
    active: int
    mean_len: float = 8.0
    keys: list[str] = field(default_factory=list)
    means: list[float] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    made: int = 0

    def __post_init__(self) -> None:
        for _ in range(self.active):
            self._new()

    def _new(self, slot: int | None = None) -> None:
        key = f"user-{self.rng.getrandbits(64):016x}-{self.made}"
        self.made += 1
        mean = self.rng.uniform(0.35, 0.95)
        # geometric lifetime with mean `mean_len` trajectories
        length = 1
        while self.rng.random() > 1.0 / self.mean_len:
            length += 1
        if slot is None:
            self.keys.append(key)
            self.means.append(mean)
            self.left.append(length)
        else:
            self.keys[slot], self.means[slot], self.left[slot] = key, mean, length

    def next(self) -> tuple[str, float]:
        i = self.rng.randrange(self.active)
        key, mean = self.keys[i], self.means[i]
        self.left[i] -= 1
        if self.left[i] <= 0:
            self._new(i)
        return key, mean


@dataclass
class Agents:
    """A small deployment: a few agents, each playing sessions of a fixed length one after
    the other, each with its own mean reward."""

    rng: random.Random
    agents: int = SMALL_AGENTS
    session_len: int = SMALL_SESSION
    keys: list[str] = field(default_factory=list)
    means: list[float] = field(default_factory=list)
    left: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.means = [self.rng.uniform(0.35, 0.65) for _ in range(self.agents)]
        self.keys = [self._key(i) for i in range(self.agents)]
        self.left = [self.session_len] * self.agents

    def _key(self, i: int) -> str:
        return f"agent{i}-session-{self.rng.getrandbits(64):016x}"

    def next(self) -> tuple[str, float]:
        i = self.rng.randrange(self.agents)
        key = self.keys[i]
        self.left[i] -= 1
        if self.left[i] <= 0:
            self.keys[i], self.left[i] = self._key(i), self.session_len
        return key, self.means[i]


async def one_run(
    bus: Any,
    data_dir: Path,
    index: int,
    sessions: int,
    drop: float,
    seed: int,
    cap: int,
    batch: int,
    small: bool = False,
) -> Run:
    from agentrl.core.settings import Settings
    from agentrl.release.service import build
    from agentrl.serving.config import Analysis, DeploySettings, RolloutPlan, Step

    plan = RolloutPlan(
        steps=[Step(weight=w, pause_s=0.0) for w in (10.0, 25.0, 50.0, 100.0)],
        analysis=Analysis(
            period_s=1.0,
            alpha=ALPHA,
            min_samples=20,
            max_reward_drop=0.1,
            reward_range=(0.0, 1.0),
            on_inconclusive="hold",
            inconclusive_deadline_s=1e9,  # judged by the cap on traffic, not by wall time
        ),
    )
    tag = f"{os.getpid()}{'s' if small else ''}{index}"
    deploy = DeploySettings(
        public_model=f"canary-bench-{tag}",
        bucket=f"bench_canary_{tag}",
        completion_log=False,
        reward_range=(0.0, 1.0),
    )
    d = await build(bus, Settings(data_dir=data_dir), deploy, validate=None, plan=plan)
    nowhere = "http://127.0.0.1:9/v1"  # never called: routing is all this bench exercises
    base = await d.deployer.bootstrap("upstream")
    assert base is not None
    await d.registry.update_model(
        base.model_id, lambda r: r.serving.update(kind="upstream", base_url=nowhere)
    )
    cand = await d.deployer.register(
        checkpoint_path="",
        base_model="upstream",
        sha256="",
        serving={"kind": "upstream", "base_url": nowhere},
    )
    await d.registry.update_model(cand.model_id, lambda r: setattr(r, "checkpoint_path", None))
    await d.manager.sync(force=True)
    await d.deployer.start(cand.model_id, plan, by="bench")
    await d.manager.sync(force=True)
    rng = random.Random(seed)
    traffic: Traffic | Agents = Agents(rng) if small else Traffic(rng, sessions)
    run = Run(sessions, drop, small)
    public = deploy.public_model
    given: dict[str, int] = {}
    try:
        while run.trajectories < cap:
            for _ in range(batch):
                key, mean = traffic.next()
                served = d.state.resolve(public, key)
                d.state.stats_for(served).requests += 1
                p = mean - (drop if served == cand.model_id else 0.0)  # drop < 0: better
                d.tracker.add(
                    served,
                    float(rng.random() < p),
                    session=key,
                    trajectory_id=f"{tag}-{run.trajectories}",
                )
                given[served] = given.get(served, 0) + 1
                run.trajectories += 1
            did = await d.controller.tick()
            run.ticks += 1
            await d.manager.sync(force=True)
            if did in ("rollback", "promote"):
                run.outcome = did
                break
        record = await d.registry.require_model(cand.model_id)
        run.reason = record.decisions[-1].reason if record.decisions else ""
        since = 0.0
        run.canary_rewards = d.tracker.summary(cand.model_id, since)[0]
        run.live_rewards = d.tracker.summary(base.model_id, since)[0]
        run.uncounted = sum(given.values()) - run.canary_rewards - run.live_rewards
    finally:
        await d.manager.close()
        try:
            await bus.js.delete_key_value(deploy.bucket)
        except Exception:
            logging.getLogger(__name__).debug("bucket %s left", deploy.bucket, exc_info=True)
    return run


async def bench(
    nats_url: str,
    data_dir: Path,
    runs: int,
    worse_runs: int,
    cap: int,
    batch: int,
    seed: int,
    concurrency: int = 8,
    small_runs: tuple[int, int, int] = (0, 0, 0),
    small_cap: int = 2000,
) -> tuple[list[Run], list[Run], list[Run]]:
    from agentrl.bus import Bus

    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    rng = random.Random(seed)
    plans = [
        (i, rng.randint(20, 200), 0.0 if i < runs else DROP, rng.getrandbits(32), False)
        for i in range(runs + worse_runs)
    ]
    same_n, worse_n, better_n = small_runs
    drops = [0.0] * same_n + [DROP] * worse_n + [-DROP] * better_n
    plans += [(i, SMALL_AGENTS, d, rng.getrandbits(32), True) for i, d in enumerate(drops)]
    sem = asyncio.Semaphore(concurrency)  # runs wait on the server, not on the CPU

    async def guarded(i: int, sessions: int, drop: float, s: int, small: bool) -> Run:
        async with sem:
            if small:
                return await one_run(
                    bus, data_dir, i, sessions, drop, s, small_cap, SMALL_BATCH, small=True
                )
            return await one_run(bus, data_dir, i, sessions, drop, s, cap, batch)

    try:
        done = await asyncio.gather(*(guarded(*p) for p in plans))
    finally:
        await bus.close()
    same = [r for r in done if r.drop == 0.0 and not r.small]
    worse = [r for r in done if r.drop != 0.0 and not r.small]
    return same, worse, [r for r in done if r.small]


def figures(same: list[Run], worse: list[Run]) -> dict[str, Any]:
    detect = [r.canary_rewards for r in worse if r.outcome == "rollback"]
    return {
        "false_rollback_rate": sum(r.outcome == "rollback" for r in same) / max(1, len(same)),
        "identical_promoted_rate": sum(r.outcome == "promote" for r in same) / max(1, len(same)),
        "identical_undecided_rate": sum(r.outcome == "undecided" for r in same) / max(1, len(same)),
        "worse_promoted_rate": sum(r.outcome == "promote" for r in worse) / max(1, len(worse)),
        "worse_rolled_back_rate": sum(r.outcome == "rollback" for r in worse) / max(1, len(worse)),
        "rewards_to_detect_p50": statistics.median(detect) if detect else None,
        "rewards_to_detect_p90": (
            sorted(detect)[min(len(detect) - 1, int(0.9 * len(detect)))] if detect else None
        ),
        "lost": sum(r.uncounted for r in same + worse),
        "runs": len(same),
        "worse_runs": len(worse),
        "alpha": ALPHA,
    }


def small_figures(small: list[Run], cap: int) -> dict[str, Any]:
    """The small deployment's figures (promoted within the deadline: before the cap)."""

    def rate(drop: float, outcome: str) -> float | None:
        rs = [r for r in small if r.drop == drop]
        return round(sum(r.outcome == outcome for r in rs) / len(rs), 4) if rs else None

    better = [r.trajectories for r in small if r.drop < 0 and r.outcome == "promote"]
    return {
        "small_false_rollback_rate": rate(0.0, "rollback"),
        "small_worse_promoted_rate": rate(DROP, "promote"),
        "small_better_promoted_rate": rate(-DROP, "promote"),
        "small_identical_promoted_rate": rate(0.0, "promote"),
        "small_worse_rolled_back_rate": rate(DROP, "rollback"),
        "small_better_episodes_p50": statistics.median(better) if better else None,
        "small_better_episodes_p90": (
            sorted(better)[min(len(better) - 1, int(0.9 * len(better)))] if better else None
        ),
        "small_runs": [sum(r.drop == d for r in small) for d in (0.0, DROP, -DROP)],
        "small_deadline_episodes": cap,
        "small_lost": sum(r.uncounted for r in small),
    }


def run_bench(
    runs: int = 200,
    worse_runs: int = 100,
    cap: int = 8_000,
    batch: int = 200,
    seed: int = 0,
    small_runs: tuple[int, int, int] = (200, 100, 100),
    small_cap: int = 2_000,
) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    from agentrl.bus.server import EmbeddedNats

    for name in ("agentrl", "agentrl.audit"):  # thousands of decisions: the table says it
        logging.getLogger(name).setLevel(logging.WARNING)
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="agentrl-bench-canary-"))
    t0 = time.time()
    with EmbeddedNats(data_dir=tmp / "nats") as nats:
        same, worse, small = asyncio.run(
            bench(
                nats.url,
                tmp,
                runs,
                worse_runs,
                cap,
                batch,
                seed,
                small_runs=small_runs,
                small_cap=small_cap,
            )
        )
    out = figures(same, worse)
    out.update(small_figures(small, small_cap))
    out["wall_s"] = round(time.time() - t0, 1)
    out["load_1m"] = round(os.getloadavg()[0], 2)
    table = Table(title="canary analysis: sticky sessions through the real controller")
    for col in ("canary", "runs", "promoted", "rolled back", "undecided", "canary rewards p50"):
        table.add_column(col, justify="right")
    for name, rs in (("identical", same), (f"{DROP:g} worse", worse)):
        n = max(1, len(rs))
        table.add_row(
            name,
            str(len(rs)),
            f"{sum(r.outcome == 'promote' for r in rs) / n:.3f}",
            f"{sum(r.outcome == 'rollback' for r in rs) / n:.3f}",
            f"{sum(r.outcome == 'undecided' for r in rs) / n:.3f}",
            f"{statistics.median([r.canary_rewards for r in rs]) if rs else 0:g}",
        )
    for name, d in (("small, identical", 0.0), (f"small, {DROP:g} worse", DROP)):
        rs = [r for r in small if r.drop == d]
        n = max(1, len(rs))
        table.add_row(
            name,
            str(len(rs)),
            f"{sum(r.outcome == 'promote' for r in rs) / n:.3f}",
            f"{sum(r.outcome == 'rollback' for r in rs) / n:.3f}",
            f"{sum(r.outcome == 'undecided' for r in rs) / n:.3f}",
            f"{statistics.median([r.canary_rewards for r in rs]) if rs else 0:g}",
        )
    rs = [r for r in small if r.drop < 0]
    if rs:
        n = len(rs)
        table.add_row(
            f"small, {DROP:g} better",
            str(n),
            f"{sum(r.outcome == 'promote' for r in rs) / n:.3f}",
            f"{sum(r.outcome == 'rollback' for r in rs) / n:.3f}",
            f"{sum(r.outcome == 'undecided' for r in rs) / n:.3f}",
            f"{statistics.median([r.canary_rewards for r in rs]):g}",
        )
    console.print(table)
    console.print(
        f"alpha {ALPHA}; 20-200 sticky sessions per run (mean 8 trajectories each); a look "
        f"every {batch} trajectories; at most {cap} trajectories per run. Small deployment: "
        f"{SMALL_AGENTS} agents, sessions of {SMALL_SESSION} episodes, a look every "
        f"{SMALL_BATCH}, deadline {small_cap} episodes"
    )
    print(json.dumps(out))
    return out


def command(cfg: CanaryBench) -> None:
    """`agentrl bench canary`."""
    run_bench(
        runs=cfg.runs,
        worse_runs=cfg.worse_runs,
        cap=cfg.cap,
        batch=cfg.batch,
        small_runs=(cfg.small_runs, cfg.small_worse_runs, cfg.small_better_runs),
        small_cap=cfg.small_cap,
    )
