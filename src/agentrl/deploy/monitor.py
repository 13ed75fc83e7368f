"""The monitor's inputs and its verdict.

`RewardTracker` keeps each version's rewards (from `agent.rl.reward.v1`, attributed by the
reward's `metadata.model`; when a reward lacks it, by the trajectory's `metadata.model`
joined on trajectory_id). `analyse` is pure: error and reward summaries of the new and the
live version since the rollout began -> one sequential check per metric
(`agentrl.deploy.sequential`) and the overall verdict, with the evidence to record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass
from typing import Any

from agentrl.deploy.config import Analysis
from agentrl.deploy.sequential import CheckResult, compare

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Summary:
    """Observations of one version: error indicators and rewards (count, sum)."""

    requests: int = 0
    errors: int = 0
    rewards: int = 0
    reward_sum: float = 0.0


def analyse(new: Summary, live: Summary, analysis: Analysis) -> tuple[str, list[CheckResult]]:
    """-> ("fail" | "pass" | "inconclusive", checks). Any failed check fails the analysis;
    it passes when every check passes."""
    lo, hi = analysis.reward_range
    checks = [
        compare(
            "error_rate",
            (new.requests, float(new.errors)),
            (live.requests, float(live.errors)),
            lo=0.0,
            hi=1.0,
            higher_is_better=False,
            tolerance=analysis.max_error_increase,
            alpha=analysis.alpha,
            min_samples=analysis.min_samples,
        ),
        compare(
            "mean_reward",
            (new.rewards, new.reward_sum),
            (live.rewards, live.reward_sum),
            lo=lo,
            hi=hi,
            higher_is_better=True,
            tolerance=analysis.max_reward_drop,
            alpha=analysis.alpha,
            min_samples=analysis.min_samples,
        ),
    ]
    if any(c.verdict == "fail" for c in checks):
        return "fail", checks
    if all(c.verdict == "pass" for c in checks):
        return "pass", checks
    return "inconclusive", checks


class RewardTracker:
    """Rewards per version with their arrival time (time.time())."""

    def __init__(self, lo: float = -1.0, hi: float = 1.0, keep: int = 200_000) -> None:
        self.lo, self.hi = lo, hi
        self.values: dict[str, deque[tuple[float, float]]] = defaultdict(lambda: deque(maxlen=keep))
        self.trajectory_model: OrderedDict[str, str] = OrderedDict()
        self.pending: OrderedDict[str, tuple[float, float]] = OrderedDict()  # traj -> (t, r)
        self.unattributed = 0

    def add(self, model: str, value: float, at: float | None = None) -> None:
        v = min(self.hi, max(self.lo, float(value)))
        self.values[model].append((at if at is not None else time.time(), v))

    def on_reward(self, event: Any) -> None:
        meta = event.metadata
        model = getattr(meta, "model", None) if meta is not None else None
        if model is None and meta is not None and getattr(meta, "model_extra", None):
            model = meta.model_extra.get("model")
        if model is None:
            model = self.trajectory_model.get(event.trajectory_id)
        if model is None or model == "unknown":
            self.pending[event.trajectory_id] = (time.time(), float(event.total_reward))
            while len(self.pending) > 100_000:
                self.pending.popitem(last=False)
                self.unattributed += 1
            return
        self.add(model, event.total_reward)

    def on_trajectory(self, event: Any) -> None:
        model = getattr(event.metadata, "model", None)
        if not model or model == "unknown":
            return
        self.trajectory_model[event.trajectory_id] = model
        while len(self.trajectory_model) > 200_000:
            self.trajectory_model.popitem(last=False)
        waiting = self.pending.pop(event.trajectory_id, None)
        if waiting is not None:
            self.add(model, waiting[1], waiting[0])

    def summary(self, model: str, since: float) -> tuple[int, float]:
        vals = [v for t, v in self.values.get(model, ()) if t >= since]
        return len(vals), float(sum(vals))

    async def run(self, bus: Any, stop: asyncio.Event, durable: str = "deploy-monitor") -> None:
        """Follow the reward and trajectory streams (new messages only) until `stop`."""
        from nats.js.api import ConsumerConfig, DeliverPolicy

        async def follow(subject: str, handler: Any) -> None:
            from agentrl.contracts.subjects import model_for

            model = model_for(subject)
            assert model is not None
            sub = await bus.js.subscribe(
                subject, config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW), manual_ack=False
            )
            try:
                while not stop.is_set():
                    try:
                        msg = await sub.next_msg(timeout=0.5)
                    except Exception:
                        continue
                    try:
                        handler(model.model_validate_json(msg.data))
                    except Exception:
                        log.debug("monitor skipped a message on %s", subject, exc_info=True)
            finally:
                await sub.unsubscribe()

        await asyncio.gather(
            follow("agent.rl.reward.v1", self.on_reward),
            follow("agent.rl.trajectory.v1", self.on_trajectory),
        )
