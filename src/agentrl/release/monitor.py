"""The monitor's inputs and its verdict.

`RewardTracker` keeps, per trajectory, its latest reward (late feedback, reward version 2,
replaces version 1: one trajectory is one observation) and credits it to the version that
served it: the reward's `metadata.model`, else the trajectory's `metadata.model` joined on
trajectory_id. A trajectory several versions played (`metadata.served_by` names more than
one, or its model is "unknown") is credited to none and counted.

The unit of analysis is the session (`session_id`, the key the gateway's sticky split
hashes): a version owns a slice of sessions, so rewards of one session are not independent
draws. `analyse` compares mean rewards per episode with a session-clustered variance (the
session is the unit of independence, `agentrl.release.sequential.compare_clustered`: a few
long sessions are evidence too, as many short ones are) and the gateway's error rates; it
is pure: summaries in, verdict and evidence out.

After a restart the evidence since the rollout began is read back from the reward and
trajectory streams (`rebuild`); arrival times are the streams' own timestamps, so a replay
and the live follower agree on what came after the rollout's start.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import orjson

from agentrl.release.sequential import CheckResult, Clustered, compare, compare_clustered
from agentrl.serving.config import Analysis

log = logging.getLogger(__name__)

REWARD = "agent.rl.reward.v1"
TRAJECTORY = "agent.rl.trajectory.v1"
# a trajectory is published before its reward: read trajectories from a little earlier
TRAJECTORY_LEAD_S = 600.0


@dataclass(frozen=True)
class Summary:
    """Observations of one version: error indicators, rewards (one per trajectory), the
    per-session means of those rewards (count, sum, sum of squares) and the rewards in
    their sessions (`clustered`; None: only the session means are known, each then taken
    as one observation)."""

    requests: int = 0
    errors: int = 0
    rewards: int = 0
    reward_sum: float = 0.0
    sessions: int = 0
    session_sum: float = 0.0
    session_sumsq: float = 0.0
    clustered: Clustered | None = None

    def episodes(self) -> Clustered:
        """The reward evidence in sessions (the session means as one-episode sessions
        when only they are known)."""
        if self.clustered is not None:
            return self.clustered
        g, y, yy = self.sessions, self.session_sum, self.session_sumsq
        return Clustered(g, g, float(g), y, float(g), y, yy)  # equal weights

    def with_errors(self, requests: int, errors: int) -> Summary:
        return replace(self, requests=requests, errors=errors)


def analyse(new: Summary, live: Summary, analysis: Analysis) -> tuple[str, list[CheckResult]]:
    """-> ("fail" | "pass" | "inconclusive", checks). Any failed check fails the analysis;
    it passes when every check passes. The reward check counts episodes in sessions: it
    is inconclusive while either side has fewer than `min_samples` episodes or
    `min_sessions` sessions (the error check: `min_samples` requests). Both use the
    observations' own spread (a version without errors is shown no worse than live after
    a few hundred requests, not thousands; the rewards' spread is the sessions')."""
    lo, hi = analysis.reward_range
    checks = [
        compare(
            "error_rate",  # 0/1 indicators: their sum of squares is their sum
            (new.requests, float(new.errors), float(new.errors)),
            (live.requests, float(live.errors), float(live.errors)),
            lo=0.0,
            hi=1.0,
            higher_is_better=False,
            tolerance=analysis.max_error_increase,
            alpha=analysis.alpha,
            min_samples=analysis.min_samples,
        ),
        compare_clustered(
            "mean_reward",
            new.episodes(),
            live.episodes(),
            lo=lo,
            hi=hi,
            higher_is_better=True,
            tolerance=analysis.max_reward_drop,
            alpha=analysis.alpha,
            min_samples=analysis.min_samples,
            min_sessions=analysis.min_sessions,
        ),
    ]
    if any(c.verdict == "fail" for c in checks):
        return "fail", checks
    if all(c.verdict == "pass" for c in checks):
        return "pass", checks
    return "inconclusive", checks


@dataclass
class Credit:
    """One trajectory's latest reward, credited to the version that served it."""

    model: str
    session: str
    value: float
    version: int
    at: float  # when the trajectory's first reward arrived (stream time)


def _when(msg: Any) -> float:
    try:
        return float(msg.metadata.timestamp.timestamp())
    except Exception:
        return time.time()


class RewardTracker:
    """Rewards per version and session; one (the latest) per trajectory."""

    def __init__(self, lo: float = -1.0, hi: float = 1.0, keep: int = 200_000) -> None:
        self.lo, self.hi, self.keep = lo, hi, keep
        self.credits: OrderedDict[str, Credit] = OrderedDict()  # trajectory_id -> credit
        # trajectory_id -> the one version that served it (None: several, or not known)
        self.trajectory_model: OrderedDict[str, str | None] = OrderedDict()
        self.pending: OrderedDict[str, tuple[float, float, int, str]] = OrderedDict()
        self.unattributed = 0  # rewards whose trajectory never named its version
        self.mixed = 0  # rewards of trajectories several versions played (not credited)
        self.replaced = 0  # late feedback that replaced an earlier reward version
        # since -> model -> session -> [rewards, sum]: running sums for the `since` values
        # the controller asks about (one per rollout), kept in step with every credit
        self._views: OrderedDict[float, dict[str, dict[str, list[float]]]] = OrderedDict()

    def _apply(self, c: Credit, sign: int) -> None:
        for since, view in self._views.items():
            if c.at >= since:
                acc = view.setdefault(c.model, {}).setdefault(c.session, [0.0, 0.0])
                acc[0] += sign
                acc[1] += sign * c.value
                if acc[0] <= 0:
                    del view[c.model][c.session]

    def _view(self, since: float) -> dict[str, dict[str, list[float]]]:
        view = self._views.get(since)
        if view is None:
            view = {}
            for c in self.credits.values():
                if c.at >= since:
                    acc = view.setdefault(c.model, {}).setdefault(c.session, [0.0, 0.0])
                    acc[0] += 1
                    acc[1] += c.value
            self._views[since] = view
            while len(self._views) > 4:
                self._views.popitem(last=False)
        return view

    # ---- input ------------------------------------------------------------------------
    def add(
        self,
        model: str,
        value: float,
        at: float | None = None,
        *,
        session: str | None = None,
        trajectory_id: str | None = None,
        version: int = 1,
    ) -> None:
        """Credit a reward to `model`. One trajectory keeps one reward: a higher `version`
        replaces the value (keeping the first arrival time), a lower or equal one is a
        redelivery or stale and changes nothing. Without a session the trajectory (or the
        reward itself) is its own session."""
        v = min(self.hi, max(self.lo, float(value)))
        if not math.isfinite(v):
            return
        tid = trajectory_id or f"anon-{len(self.credits)}-{time.monotonic_ns()}"
        now = at if at is not None else time.time()
        old = self.credits.get(tid)
        if old is not None:
            if version <= old.version:
                return
            self.replaced += 1
            self._apply(old, -1)
            old.model, old.value, old.version = model, v, version
            old.session = session or old.session
            self._apply(old, +1)
            return
        c = self.credits[tid] = Credit(model, session or tid, v, version, now)
        self._apply(c, +1)
        while len(self.credits) > self.keep:
            self._apply(self.credits.popitem(last=False)[1], -1)

    def on_reward(self, event: Any, at: float | None = None) -> None:
        meta = event.metadata
        version = int(getattr(meta, "version", 1) or 1) if meta is not None else 1
        value = float(event.total_reward)
        session = str(getattr(event, "session_id", "") or "") or None
        tid = event.trajectory_id
        now = at if at is not None else time.time()
        if tid in self.trajectory_model and self.trajectory_model[tid] is None:
            self.mixed += 1  # the trajectory said: several versions (or none) served it
            return
        model = getattr(meta, "model", None) if meta is not None else None
        if model is None and meta is not None and getattr(meta, "model_extra", None):
            model = meta.model_extra.get("model")
        if model is None or model == "unknown":
            model = self.trajectory_model.get(tid)
        if model is None or model == "unknown":
            self.pending[tid] = (now, value, version, session or "")
            while len(self.pending) > 100_000:
                self.pending.popitem(last=False)
                self.unattributed += 1
            return
        self.add(str(model), value, now, session=session, trajectory_id=tid, version=version)

    def on_trajectory(self, event: Any) -> None:
        extra = getattr(event.metadata, "model_extra", None) or {}
        self.note_trajectory(
            event.trajectory_id,
            getattr(event.metadata, "model", None),
            extra.get("served_by"),
            str(getattr(event, "session_id", "") or ""),
        )

    def note_trajectory(
        self, tid: str, model: str | None, served_by: Any = None, session: str = ""
    ) -> None:
        """The version a trajectory names: one that served all its turns, or none (several
        versions in `served_by`, or "unknown"): then its rewards are credited to no version."""
        if isinstance(served_by, list) and len({str(s) for s in served_by}) > 1:
            model = None
        if not model or model == "unknown":
            model = None
        self.trajectory_model[tid] = model
        while len(self.trajectory_model) > self.keep:
            self.trajectory_model.popitem(last=False)
        if model is None:
            old = self.credits.pop(tid, None)  # a reward credited before we knew
            if old is not None:
                self._apply(old, -1)
                self.mixed += 1
        waiting = self.pending.pop(tid, None)
        if waiting is None:
            return
        if model is None:
            self.mixed += 1
            return
        t, value, version, sess = waiting
        self.add(
            model, value, t, session=sess or session or None, trajectory_id=tid, version=version
        )

    # ---- output -----------------------------------------------------------------------
    def summary(self, model: str, since: float) -> tuple[int, float]:
        """(rewards, their sum): one reward per trajectory, arrived since `since`."""
        per = self._view(since).get(model, {})
        return int(sum(k for k, _ in per.values())), float(sum(s for _, s in per.values()))

    def sessions(self, model: str, since: float) -> Summary:
        """Rewards and per-session mean rewards of `model` since `since` (no error counts)."""
        per = self._view(since).get(model, {})
        means = [s / k for k, s in per.values()]
        return Summary(
            rewards=int(sum(k for k, _ in per.values())),
            reward_sum=float(sum(s for _, s in per.values())),
            sessions=len(means),
            session_sum=float(sum(means)),
            session_sumsq=float(sum(m * m for m in means)),
            clustered=Clustered.of([(int(k), float(s)) for k, s in per.values()]),
        )

    # ---- the streams ------------------------------------------------------------------
    async def rebuild(self, bus: Any, since: float) -> int:
        """Read the reward and trajectory streams from the rollout's start (`since`, unix
        seconds) to now into the tracker: the evidence a restarted controller lost. Safe to
        repeat and to overlap the live follower (one reward per trajectory, the latest).
        Returns the messages read."""
        read = await self._replay(bus, REWARD, since, self._reward_msg)
        if self.pending:  # rewards that name no version: their trajectories do
            first = min(t for t, *_ in self.pending.values())
            read += await self._replay(bus, TRAJECTORY, first - TRAJECTORY_LEAD_S, self._traj_msg)
        log.info("monitor evidence rebuilt from %d messages since %.0f", read, since)
        return read

    def _traj_msg(self, msg: Any) -> None:
        # only the ids and the version are needed: no validation of every turn
        d = orjson.loads(msg.data)
        meta = d.get("metadata") or {}
        model = meta.get("model")
        self.note_trajectory(
            str(d["trajectory_id"]),
            str(model) if model else None,
            meta.get("served_by"),
            str(d.get("session_id") or ""),
        )

    def _reward_msg(self, msg: Any) -> None:
        from agentrl.contracts.reward import RewardEvent

        self.on_reward(RewardEvent.model_validate_json(msg.data), _when(msg))

    async def _replay(self, bus: Any, subject: str, since: float, handle: Any) -> int:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        from agentrl.contracts.streams import stream_for

        stream = stream_for(subject).name
        sub = await bus.js.pull_subscribe(
            subject,
            stream=stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_TIME,
                opt_start_time=datetime.fromtimestamp(max(since, 0.0), UTC),
                ack_policy=AckPolicy.NONE,
                inactive_threshold=30.0,
                filter_subject=subject,
            ),
        )
        seen = 0
        try:
            pending = int((await sub.consumer_info()).num_pending or 0)
            while seen < pending:
                try:
                    msgs = await sub.fetch(min(1000, pending - seen), timeout=2.0)
                except Exception:
                    break
                for msg in msgs:
                    try:
                        handle(msg)
                    except Exception:
                        log.debug("monitor skipped a message on %s", subject, exc_info=True)
                seen += len(msgs)
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                log.debug("replay consumer on %s left to expire", subject, exc_info=True)
        return seen

    async def run(self, bus: Any, stop: asyncio.Event, durable: str = "deploy-monitor") -> None:
        """Follow the reward and trajectory streams (new messages only) until `stop`.

        The consumers ask for no acks: read through `next_msg`, nats-py acks nothing, and a
        consumer that wants acks stops delivering at `max_ack_pending` (1,000) — the monitor
        went blind after its first thousand rewards and every later canary stayed undecided."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        async def follow(subject: str, handler: Any) -> None:
            sub = await bus.js.subscribe(
                subject,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NONE),
                manual_ack=True,
            )
            try:
                while not stop.is_set():
                    try:
                        msg = await sub.next_msg(timeout=0.5)
                    except Exception:
                        continue
                    try:
                        handler(msg)
                    except Exception:
                        log.debug("monitor skipped a message on %s", subject, exc_info=True)
            finally:
                await sub.unsubscribe()

        await asyncio.gather(follow(REWARD, self._reward_msg), follow(TRAJECTORY, self._traj_msg))
