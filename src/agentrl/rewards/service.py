"""The reward service: consume `agent.rl.trajectory.v1`, redact, score, publish `agent.rl.reward.v1`.

It also consumes `agent.rl.feedback.v1`: feedback for a scored trajectory produces the next
reward version (same trajectory, version + 1, its own deterministic id); feedback that arrives
before its trajectory waits in the store and is folded into version 1.

Per batch (256 trajectories with `agentrl rewards serve`; the per-batch costs, a transaction,
a pre-scan setup, the window statistics, are spread over the batch): drop opted-out
trajectories, ack redelivered ones whose reward is already stored (never scored or published
twice), redact PII, lint all code of the batch in one ruff+bandit run, run custom reward
functions concurrently, score the batch (vectorised), and commit windows, rewards and an
outbox entry per reward in one SQLite transaction. The next batch is prepared while that
commit runs in a worker thread (the outcomes are `Deferred`); once it is durable, the bus acks
the trajectories while the rewards are published in the background; their PubAcks empty the
outbox, and whatever a crash leaves in it is published at the next start under the same ids,
except the ones the reward stream already holds (exactly once at any delay; JetStream's
duplicate window is only the second line of defence). A trajectory that cannot be scored is
dead-lettered with the reason; the service keeps going. The two consumers run in one
TaskGroup: when one fails, the other is cancelled and the service stops with the error (the
supervisor restarts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import sqlite3
import time
from collections import Counter, deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.errors
import orjson

from agentrl.bus import Bus, ConsumeStats, Deferred, Delivery, PermanentError, TransientError
from agentrl.contracts.feedback import FeedbackEvent
from agentrl.contracts.subjects import FEEDBACK, REWARD, TRAJECTORY
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.core.settings import Settings, get_settings
from agentrl.observability import instrument as obs
from agentrl.rewards.calculator import Scored, ScoringInput, rescore_with_feedback, score_batch
from agentrl.rewards.claims import Claims, Record
from agentrl.rewards.code import CodeChecker
from agentrl.rewards.components import FeedbackState, correction_of
from agentrl.rewards.config import RewardConfig
from agentrl.rewards.pipeline import Preparer, opt_out_reason
from agentrl.rewards.store import RewardStore, StoredReward
from agentrl.rewards.window import WindowState

log = logging.getLogger(__name__)

# Set by `collector_off`: this process is the reward service alone, its collector off
_collect_here = False


def collector_off() -> None:
    """For a process that is the reward service alone (`agentrl rewards serve`, its bench): a
    batch keeps ~256 validated trajectories alive while it allocates, which makes the
    automatic collector re-scan them again and again (validation costs twice as much).
    Freeze what exists, turn the collector off; the service collects between batches."""
    global _collect_here
    gc.freeze()
    gc.disable()
    _collect_here = True


class RewardService:
    """One reward service; `await service.run(stop)` until `stop` is set."""

    def __init__(
        self,
        bus: Bus,
        config: RewardConfig | None = None,
        data_dir: str | Path | None = None,
        *,
        durable: str = "rewards",
        batch: int = 512,
        max_deliver: int = 5,
        ack_wait: float = 30.0,
        max_inflight: int = 4,
        checker: CodeChecker | None = None,
    ) -> None:
        self.bus = bus
        self.config = config or RewardConfig()
        base = Path(data_dir) if data_dir is not None else get_settings().data_dir
        self.store = RewardStore(base / "rewards" / "state.sqlite")
        self.state = self.store.load_windows(self.config.window, self.config.efficiency_window)
        self.counters: Counter[str] = Counter(self.store.load_counters())
        self.preparer = Preparer(self.config, checker=checker)
        self.redactor = self.preparer.redactor
        self.durable = durable
        self.batch = batch
        self.max_deliver = max_deliver
        self.ack_wait = ack_wait
        self.max_inflight = max_inflight
        self._inflight: deque[asyncio.Task[bool]] = deque()
        # The shared records (NATS KV) that make replicas exactly-once; opened by `run`.
        self.claims: Claims | None = None
        self._inflight_ids: set[str] = set()  # reward ids an in-flight publish carries
        # One SQLite connection, used from the loop and (for the fsynced batch commit) from a
        # worker thread: every use goes through this lock, so transactions never overlap and
        # the loop keeps acking and publishing while the disk flushes.
        self._db = asyncio.Lock()
        self._committing: asyncio.Future[None] | None = None
        self._failures_seen = 0
        # Skip two lookups per batch while there is nothing to find (the common case).
        self._have_dropped = self.store.has_rows("dropped")
        self._have_pending = self.store.has_rows("feedback", "version IS NULL")
        self.trajectory_stats = ConsumeStats()
        self.feedback_stats = ConsumeStats()
        self._last_prune = 0.0
        self._last_collect = time.monotonic()

    # ---- lifecycle --------------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Consume trajectories and feedback until `stop` is set.

        Structured: both consumers and the housekeeping loop run in one TaskGroup, so when
        one fails the others are cancelled before the store closes, and `run` raises that
        failure (the caller, e.g. `agentrl up`'s supervisor, restarts the service)."""
        stop = stop or asyncio.Event()
        await self.bus.ensure_streams()
        self.claims = await Claims.open(
            self.bus.nc,
            self.bus.js,
            self.durable,
            replicas=self.bus.stream_replicas,
            ttl_s=self.config.retention_days * 86400,
        )
        self._maybe_prune()
        log.info(
            "reward service started (calculator %s, %d rewards stored)",
            self.config.calculator_version,
            self.store.count(),
        )
        try:
            await self._replay_outbox()
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(
                        self.bus.consume(
                            TRAJECTORY,
                            self.durable,
                            batch_handler=self.handle_trajectories,
                            batch=self.batch,
                            max_deliver=self.max_deliver,
                            ack_wait=self.ack_wait,
                            stop=stop,
                            stats=self.trajectory_stats,
                        ),
                        name="rewards:trajectories",
                    )
                    tg.create_task(
                        self.bus.consume(
                            FEEDBACK,
                            f"{self.durable}-feedback",
                            batch_handler=self.handle_feedback,
                            batch=self.batch,
                            max_deliver=self.max_deliver,
                            ack_wait=self.ack_wait,
                            stop=stop,
                            stats=self.feedback_stats,
                        ),
                        name="rewards:feedback",
                    )
                    tg.create_task(self._housekeeping(stop), name="rewards:housekeeping")
            except BaseExceptionGroup as group:
                first = _first_error(group)
                log.error("reward service stopped: %s: %s", type(first).__name__, first)
                raise first from group
            await self._drain_publishes()
        finally:
            await self._cancel_publishes()
            if self._committing is not None and not self._committing.done():
                await asyncio.wait([self._committing], timeout=30)
            self.close()

    # ---- publishing: pipelined, confirmed through the outbox ------------------------------
    def _publish_later(self, items: list[tuple[str, bytes, str]]) -> asyncio.Task[bool] | None:
        """Publish in the background and take the rewards out of the outbox once JetStream
        has them. The next batch is fetched and scored while these PubAcks travel; the
        trajectories are acked only once the task says the rewards are stored (a replica
        whose machine is lost with its outbox leaves them unacked, so another replica
        publishes them from the shared records)."""
        if not items:
            return None
        self._inflight_ids.update(rid for _, _, rid in items)
        task = asyncio.create_task(self._publish(items))
        self._inflight.append(task)
        return task

    async def _publish(self, items: list[tuple[str, bytes, str]]) -> bool:
        ids = [rid for _, _, rid in items]
        try:
            try:
                await self.bus.publish_many(items)
            except Exception as exc:  # left in the outbox: retried by the next replay
                log.warning(
                    "publishing %d rewards failed (kept in the outbox): %s", len(items), exc
                )
                self.counters["publish_failures"] += 1
                return False
            # A service closed meanwhile replays these at its next start (after checking the
            # stream, so they are not published twice).
            async with self._db:
                with contextlib.suppress(sqlite3.ProgrammingError):
                    self.store.confirm(ids)
            return True
        finally:
            self._inflight_ids.difference_update(ids)

    async def _backpressure(self) -> None:
        """At most `max_inflight` batches of rewards wait for their PubAcks."""
        while self._inflight and self._inflight[0].done():
            self._inflight.popleft()
        while len(self._inflight) > self.max_inflight:
            await self._inflight.popleft()
        if self.counters["publish_failures"] > self._failures_seen:
            self._failures_seen = self.counters["publish_failures"]
            await self._replay_outbox(older_than_s=5.0)

    async def _drain_publishes(self) -> None:
        while self._inflight:
            await self._inflight.popleft()
        await self._replay_outbox()

    async def _cancel_publishes(self) -> None:
        """After a failure: stop what is in flight (the outbox keeps it for the next start)."""
        tasks = list(self._inflight)
        self._inflight.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    async def _replay_outbox(self, older_than_s: float = 0.0) -> None:
        """Publish what a crash (or a failed publish) left unconfirmed, under the same ids.

        A crash between JetStream's PubAck and the confirm leaves rewards in the outbox that
        the stream already holds; publishing them again would duplicate them once the
        duplicate window has passed. So the reward stream is read back (message ids only)
        from the oldest row's time on, and what it holds is confirmed without publishing."""
        while True:
            async with self._db:
                found = self.store.outbox_rows(older_than_s, limit=5000)
            rows = [r for r in found if r[0] not in self._inflight_ids]
            if not rows:
                return
            since = min(at for _, _, at in rows)
            try:
                stored = await published_reward_ids(self.bus, since - STREAM_CHECK_MARGIN_S)
            except Exception as exc:
                log.warning("cannot read the reward stream back, will retry later: %s", exc)
                return
            already = [rid for rid, _, _ in rows if rid in stored]
            latest: dict[str, bytes] = {}
            for rid, data, _ in rows:
                if rid in stored:
                    continue
                latest_id = str(json.loads(data)["reward_id"])
                if latest_id not in stored:
                    latest[latest_id] = data
            try:
                await self.bus.publish_many([(REWARD, data, rid) for rid, data in latest.items()])
            except Exception as exc:
                log.warning("outbox replay failed, will retry later: %s", exc)
                return
            async with self._db:
                self.store.confirm([rid for rid, _, _ in rows])
            self.counters["outbox_replayed"] += len(rows) - len(already)
            self.counters["outbox_already_published"] += len(already)
            log.info(
                "outbox: published %d rewards, %d were already in the stream",
                len(rows) - len(already),
                len(already),
            )

    def close(self) -> None:
        self.store.close()
        self.preparer.checker.close()  # the bandit worker process

    def stats(self) -> dict[str, Any]:
        return {
            **dict(self.counters),
            "dead_lettered": self.trajectory_stats.dead_lettered
            + self.feedback_stats.dead_lettered,
            "code_checker": dict(self.preparer.checker.stats),
        }

    def _maybe_collect(self) -> None:
        """With automatic garbage collection off (`collector_off`), collect cycles every few
        seconds, between batches. Not in a shared process (`agentrl up`, `agentrl loop`):
        there the bus only pauses the collector while a batch is handled (it was seen off
        then, and a full collection walked torch and the model every 5 s: 13 a quick loop,
        1.2 CPU-s)."""
        if _collect_here and not gc.isenabled() and time.monotonic() - self._last_collect > 5.0:
            gc.collect()
            self._last_collect = time.monotonic()

    async def _housekeeping(self, stop: asyncio.Event) -> None:
        """Every few seconds: collect cyclic garbage (idle consumers still make a little) and
        publish outbox rows a failed publish left behind."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5.0)
            if stop.is_set():
                return
            self._maybe_collect()
            await self._replay_outbox(older_than_s=30.0)

    def _maybe_prune(self) -> None:
        if time.monotonic() - self._last_prune > 3600:
            self._last_prune = time.monotonic()
            pruned = self.store.prune(self.config.retention_days * 86400)
            if pruned:
                log.info(
                    "pruned %d stored rewards older than %s days",
                    pruned,
                    self.config.retention_days,
                )

    # ---- trajectories -----------------------------------------------------------------
    async def handle_trajectories(self, deliveries: list[Delivery]) -> Deferred:
        """The batch handler of `agent.rl.trajectory.v1` (one outcome per delivery).

        Preparing (redaction, code checks, custom functions) needs neither the store nor
        the windows, so it runs before the store lock and overlaps the previous batch's
        commit. Scoring and this batch's commit run under the lock, which the commit
        releases; the outcomes are `Deferred` until the commit is durable (only then does
        the bus ack the batch)."""
        started = time.perf_counter()
        n = len(deliveries)
        outcomes: list[BaseException | None] = [None] * n
        events: list[TrajectoryEvent] = [d.event for d in deliveries]
        ids = [e.trajectory_id for e in events]
        opted_out: dict[int, str] = {}
        guess: list[int] = []  # what to score unless the store says otherwise (it rarely does)
        copies: set[int] = set()  # later copies of a trajectory in this batch (the first decides)
        first: set[str] = set()
        for i, ev in enumerate(events):
            if ev.trajectory_id in first:
                copies.add(i)
                continue
            first.add(ev.trajectory_id)
            if (why := opt_out_reason(ev, self.config)) is not None:
                opted_out[i] = why
            else:
                guess.append(i)
        raws = [d.data for d in deliveries]
        prepared = await self.preparer.prepare(events, raws, guess)

        await self._db.acquire()
        try:
            stored = self.store.rewards(ids)
            # A stored reward still in the outbox is not known to be published: its
            # trajectory waits (nak) until it is, rather than being acked on a local promise.
            unconfirmed = self.store.unconfirmed(list(stored)) if stored else set()
            already_dropped = self.store.dropped(ids) if self._have_dropped else set()
            delta: Counter[str] = Counter()  # counted only once the batch is committed
            drops: list[tuple[str, str]] = []
            todo: list[int] = []
            for i, ev in enumerate(events):
                tid = ev.trajectory_id
                if tid in stored:  # redelivered or republished: its reward is in the outbox or out
                    self.counters["redelivered"] += 1  # observed, not committed state
                    if tid in unconfirmed and i not in copies:
                        outcomes[i] = TransientError("its reward is not confirmed published yet")
                        self.counters["publish_failures"] += 1  # replay the outbox soon
                elif tid in already_dropped or i in copies:
                    pass
                elif i in opted_out:
                    drops.append((tid, opted_out[i]))
                    delta["dropped_opt_out"] += 1
                else:
                    todo.append(i)
            if todo != guess:  # some were scored before (a redelivery): prepare the rest anew
                prepared = await self.preparer.prepare(events, raws, todo)
            delta.update(prepared.counters)
            for i, failure in prepared.failures.items():
                cls = PermanentError if failure.kind == "permanent" else TransientError
                outcomes[i] = cls(failure.reason)
            rewards, new_state, commit = self._score(
                prepared.order, prepared.inputs, outcomes, delta
            )
            rewards, feedback_new = await self._claim(
                events, rewards, commit, drops, outcomes, delta
            )
            committed = self._start_commit(
                rewards=commit["rewards"],
                windows=new_state,
                feedback_new=feedback_new,
                feedback_applied=commit["feedback_applied"],
                dropped=drops,
                counters=dict(self.counters + delta),
                outbox=[(r.reward_id, r.trajectory_id, r.to_json()) for r in rewards],
            )
        except BaseException:
            self._db.release()
            raise

        async def finish() -> list[BaseException | None]:
            try:
                await asyncio.shield(committed)
                self.counters.update(delta)
                self.state = new_state
                self._maybe_prune()
            finally:
                self._db.release()
            obs.reward_batch(events, rewards, time.perf_counter() - started)  # never raises
            if drops:
                self._have_dropped = True
            if feedback_new:
                self._have_pending = True
            self._maybe_collect()
            task = self._publish_later([(REWARD, r.to_json(), r.reward_id) for r in rewards])
            await self._backpressure()
            if task is not None and not await asyncio.shield(task):
                where = {tid: i for i, tid in reversed(list(enumerate(ids)))}
                for r in rewards:  # kept in the outbox; acked once it is published
                    i = where[r.trajectory_id]
                    outcomes[i] = outcomes[i] or TransientError("reward not confirmed published")
            return outcomes

        return Deferred(asyncio.ensure_future(finish()))

    async def _claim(
        self,
        events: list[TrajectoryEvent],
        rewards: list[Scored],
        commit: dict[str, Any],
        drops: list[tuple[str, str]],
        outcomes: list[BaseException | None],
        delta: Counter[str],
    ) -> tuple[list[Scored], list[tuple[str, str, str, int | None]]]:
        """Commit this batch's rewards to the shared records (create-only keys, see
        `claims`); returns the rewards to publish and feedback rows to store.

        A record another replica committed first wins: its reward replaces ours here (so
        the local cache agrees) and is published again only when the reward stream lacks
        it (that replica died between its commit and its publish; same Msg-Id). Feedback
        another replica recorded before the trajectory arrived is stored here and the
        trajectory is nakked: its redelivery is scored with the feedback folded in."""
        if self.claims is None:  # not running on a bus (the profiler)
            return rewards, []
        claims, now = self.claims, time.time()
        if drops:
            dropped = orjson.dumps({"version": 0, "dropped": "opted out", "at": now})
            await claims.create_many([(tid, dropped) for tid, _ in drops])
        rows: list[tuple[str, int, bytes, dict[str, Any]]] = commit["rewards"]
        found = await claims.create_many(
            [(tid, claims.scored(data, fb, v, now)) for tid, v, data, fb in rows]
        )
        if all(rec is None for rec in found):
            return rewards, []
        where = {ev.trajectory_id: i for i, ev in reversed(list(enumerate(events)))}
        mine: list[Scored] = []
        kept: list[tuple[str, int, bytes, dict[str, Any]]] = []
        theirs: list[tuple[Scored, Record]] = []
        feedback_new: list[tuple[str, str, str, int | None]] = []
        own = 0
        for r, row, rec in zip(rewards, rows, found, strict=True):
            tid = r.trajectory_id
            if rec is None:
                mine.append(r)
                kept.append(row)
            elif rec.scored:
                win = Scored(rec.data["reward"])
                theirs.append((win, rec))
                kept.append((tid, rec.version, win.to_json(), rec.data.get("feedback", {})))
                if rec.data.get("by") == claims.replica:  # an earlier attempt of ours
                    own += 1
                else:
                    delta["scored_by_another_replica"] += 1
            elif rec.dropped is not None:
                drops.append((tid, rec.dropped))
            else:  # feedback first, recorded by a replica: fold it in (now or at redelivery)
                have = set(row[3].get("feedback_ids", []))
                missing = [p for p in rec.pending if p["feedback_id"] not in have]
                if not missing:
                    value = claims.scored(row[2], row[3], row[1], now)
                    if await claims.update(tid, value, rec.revision) is not None:
                        mine.append(r)
                        kept.append(row)
                        continue
                feedback_new += [(p["feedback_id"], tid, json.dumps(p), None) for p in missing]
                outcomes[where[tid]] = TransientError("feedback came first: scored again with it")
        delta["trajectories_scored"] -= len(rewards) - len(mine) - own
        delta["rewards_published"] -= len(rewards) - len(mine)
        applied = {fid for fid, _ in commit["feedback_applied"]}
        commit["rewards"] = kept
        commit["feedback_applied"] = [
            (fid, 1) for row in kept for fid in row[3].get("feedback_ids", []) if fid in applied
        ]
        republish = await self._missing_from_stream(theirs, now)
        delta["rewards_published"] += len(republish)
        delta["republished_committed"] += len(republish)
        return mine + republish, feedback_new

    async def _missing_from_stream(
        self, records: list[tuple[Scored, Record]], now: float
    ) -> list[Scored]:
        """The committed rewards among these that the reward stream does not hold.

        Only records younger than the redelivery horizon are checked: an older record's
        message was redelivered (to a replica that published it) long ago, or was
        dead-lettered; reading the stream back from days ago would cost more than it tells."""
        horizon = now - self.ack_wait * (self.max_deliver + 1) - 60.0
        recent = [(r, rec) for r, rec in records if float(rec.data.get("at", 0.0)) > horizon]
        if not recent:
            return []
        since = min(float(rec.data["at"]) for _, rec in recent)
        held = await published_reward_ids(self.bus, since - STREAM_CHECK_MARGIN_S)
        return [r for r, _ in recent if r.reward_id not in held]

    async def _superseded_unpublished(
        self, superseded: list[tuple[Scored, Record]], stored: dict[str, StoredReward]
    ) -> list[Scored]:
        """The reward versions feedback just superseded that no one published.

        A replica killed between committing version n to the shared record and publishing
        it leaves a version only its redelivery would publish, and that redelivery finds
        version n+1 once feedback moved the record on: version n would be lost. Versions
        this replica holds as published (its store has them, nothing in its outbox) are
        skipped; the others are checked against the reward stream."""
        if not superseded:
            return []
        pending = self.store.unconfirmed([r.trajectory_id for r, _ in superseded])
        unsure = [
            (r, rec)
            for r, rec in superseded
            if r.trajectory_id in pending
            or (s := stored.get(r.trajectory_id)) is None
            or s.version < r.version
        ]
        return await self._missing_from_stream(unsure, time.time())

    def _score(
        self,
        order: list[int],
        inputs: dict[int, ScoringInput],
        outcomes: list[BaseException | None],
        delta: Counter[str],
    ) -> tuple[list[Scored], WindowState, dict[str, Any]]:
        """Fold in pending feedback and score; returns the rewards, the next windows and the
        rows to commit. `delta` (this batch's counts) enters `self.counters` only after the
        commit, and the windows become `self.state` only then too."""
        ids = [inputs[i].trajectory.trajectory_id for i in order]
        pending = self.store.pending_feedback(ids) if self._have_pending else {}
        for i in order:
            traj = inputs[i].trajectory
            fb = FeedbackState.from_trajectory(traj)
            for payload in pending.get(traj.trajectory_id, []):
                fb.apply(
                    payload["type"],
                    payload.get("rating"),
                    payload["feedback_id"],
                    correction_of(payload),  # the stored payload is the redacted one
                )
            inputs[i].feedback = fb
        items = [inputs[i] for i in order]
        try:
            rewards, new_state = score_batch(items, self.state, self.config)
        except Exception:  # find the culprit(s) one by one, dead-letter them, score the rest
            log.warning("batch scoring failed; isolating", exc_info=True)
            state, rewards, keep = self.state, [], []
            for i in order:
                try:
                    (r,), state = score_batch([inputs[i]], state, self.config)
                except Exception as exc:
                    outcomes[i] = PermanentError(f"scoring failed: {type(exc).__name__}: {exc}")
                    continue
                rewards.append(r)
                keep.append(i)
            new_state, order = state, keep
        fb_by_id = {
            inputs[i].trajectory.trajectory_id: inputs[i].feedback or FeedbackState() for i in order
        }
        rows = [
            (r.trajectory_id, r.version, r.to_json(), fb_by_id[r.trajectory_id].to_dict())
            for r in rewards
        ]
        applied = [(fid, 1) for r in rewards for fid in fb_by_id[r.trajectory_id].feedback_ids]
        delta["trajectories_scored"] += len(rewards)
        delta["rewards_published"] += len(rewards)
        delta["feedback_applied"] += len(applied)
        return rewards, new_state, {"rewards": rows, "feedback_applied": applied}

    def _start_commit(self, **rows: Any) -> asyncio.Future[None]:
        """`store.commit` in a worker thread (its fsync does not stall the loop). A cancelled
        waiter leaves the commit to finish (callers shield it), and `run` waits for it
        before it closes the store (the batch's trajectories, not acked, come back as
        redeliveries)."""
        # Submitted now, not when a task first runs: the commit must overlap the work the
        # loop does before its next await (preparing the next batch).
        fut = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.store.commit, **rows)
        )
        self._committing = fut
        return fut

    async def _commit(self, **rows: Any) -> None:
        await asyncio.shield(self._start_commit(**rows))

    async def handle_feedback(self, deliveries: list[Delivery]) -> list[BaseException | None]:
        """The batch handler of `agent.rl.feedback.v1`: acked once the rewards it produced
        are stored in the reward stream."""
        async with self._db:
            outcomes, publish = await self._feedback(deliveries)
        task = self._publish_later([(REWARD, r.to_json(), r.reward_id) for r in publish])
        await self._backpressure()
        if task is not None and not await asyncio.shield(task):
            failed = {r.trajectory_id for r in publish}
            for i, d in enumerate(deliveries):
                if d.event.trajectory_id in failed:
                    outcomes[i] = outcomes[i] or TransientError("reward not confirmed published")
        return outcomes

    async def _feedback(
        self, deliveries: list[Delivery]
    ) -> tuple[list[BaseException | None], list[Scored]]:
        outcomes: list[BaseException | None] = [None] * len(deliveries)
        events: list[FeedbackEvent] = [d.event for d in deliveries]
        seen = self.store.feedback_seen([e.feedback_id for e in events])
        stored = self.store.rewards([e.trajectory_id for e in events])
        dropped = self.store.dropped([e.trajectory_id for e in events])
        unconfirmed = self.store.unconfirmed([tid for tid, _ in seen.values()]) if seen else set()
        latest: dict[str, Scored] = {}
        states: dict[str, FeedbackState] = {}
        records: dict[str, Record | None] = {}
        theirs: list[tuple[Scored, Record]] = []
        superseded: list[tuple[Scored, Record]] = []
        new_rows: list[tuple[str, str, str, int | None]] = []
        delta: Counter[str] = Counter()
        for i, ev in enumerate(events):
            tid = ev.trajectory_id
            if ev.feedback_id in seen or any(r[0] == ev.feedback_id for r in new_rows):
                # its reward version is committed; acked once it is confirmed published
                if seen.get(ev.feedback_id, ("", None))[0] in unconfirmed:
                    outcomes[i] = TransientError("its reward is not confirmed published yet")
                    self.counters["publish_failures"] += 1  # replay the outbox soon
                continue
            if tid in dropped or (
                ev.user_id is not None and ev.user_id in self.config.opt_out_users
            ):
                delta["feedback_dropped_opt_out"] += 1
                continue
            try:
                FeedbackState().apply(ev.type, ev.rating)
            except ValueError as exc:
                outcomes[i] = PermanentError(str(exc))
                continue
            payload = (
                self.redactor.redact(ev.model_dump(mode="json"))
                if self.config.redact
                else ev.model_dump(mode="json")
            )
            row_payload = json.dumps(payload)
            if self.claims is not None:  # the shared record decides
                try:
                    kind, reward, state, rec = await self._apply_shared(ev, payload, records)
                except TransientError as exc:
                    outcomes[i] = exc
                    continue
                if kind == "pending":
                    new_rows.append((ev.feedback_id, tid, row_payload, None))
                    delta["feedback_pending"] += 1
                elif kind == "dropped":
                    delta["feedback_dropped_opt_out"] += 1
                elif kind == "already" and reward is not None and rec is not None:
                    new_rows.append((ev.feedback_id, tid, row_payload, reward.version))
                    theirs.append((reward, rec))
                elif reward is not None and state is not None:  # applied
                    if rec is not None and tid not in latest:  # the version before this batch
                        superseded.append((Scored(rec.data["reward"]), rec))
                    latest[tid], states[tid] = reward, state
                    new_rows.append((ev.feedback_id, tid, row_payload, reward.version))
                    delta["feedback_applied"] += 1
                continue
            if tid not in stored and tid not in latest:
                new_rows.append((ev.feedback_id, tid, row_payload, None))
                delta["feedback_pending"] += 1
                continue
            if tid not in latest:
                previous = json.loads(stored[tid].reward_json)
                states[tid] = FeedbackState.from_dict(stored[tid].feedback)
            else:
                previous = latest[tid].payload
            states[tid].apply(ev.type, ev.rating, ev.feedback_id, correction_of(payload))
            latest[tid] = rescore_with_feedback(previous, states[tid], self.state, self.config)
            new_rows.append((ev.feedback_id, tid, row_payload, latest[tid].version))
            delta["feedback_applied"] += 1
        delta["rewards_published"] += len(latest)
        rows = [(tid, r.version, r.to_json(), states[tid].to_dict()) for tid, r in latest.items()]
        republish = [
            r
            for r in await self._missing_from_stream(theirs, time.time())
            if r.trajectory_id not in latest
        ]
        rows += [
            (r.trajectory_id, r.version, r.to_json(), rec.data.get("feedback", {}))
            for r, rec in theirs
            if r.trajectory_id not in latest
        ]
        unpublished = await self._superseded_unpublished(superseded, stored)
        delta["rewards_published"] += len(unpublished)
        delta["republished_committed"] += len(unpublished)
        publish = [*unpublished, *latest.values(), *republish]
        await self._commit(
            rewards=rows,
            feedback_new=new_rows,
            counters=dict(self.counters + delta),
            outbox=[(r.reward_id, r.trajectory_id, r.to_json()) for r in publish],
        )
        self.counters.update(delta)
        if delta["feedback_pending"]:
            self._have_pending = True
        return outcomes, publish

    async def _apply_shared(
        self, ev: FeedbackEvent, payload: dict[str, Any], records: dict[str, Record | None]
    ) -> tuple[str, Scored | None, FeedbackState | None, Record | None]:
        """Apply one feedback event to its trajectory's shared record (compare-and-set).

        Returns ("pending"|"dropped"|"applied"|"already", reward, feedback state, record):
        before its trajectory is scored the feedback is appended to the record's pending
        list; after, it makes the next reward version (the record returned is the one it
        superseded), unless the record already carries it ("already": committed by a
        replica, maybe never published). `records` caches this batch's latest records."""
        assert self.claims is not None
        claims, tid = self.claims, ev.trajectory_id
        for _ in range(8):
            rec = records.pop(tid) if tid in records else await claims.get(tid)
            if rec is None:
                value = orjson.dumps({"version": 0, "pending": [payload], "at": time.time()})
                rec = await claims.create(tid, value)
                if rec is None:
                    records[tid] = await claims.get(tid)
                    return "pending", None, None, None
                records[tid] = rec
                continue
            if rec.dropped is not None:
                records[tid] = rec
                return "dropped", None, None, None
            if not rec.scored:
                if any(p.get("feedback_id") == ev.feedback_id for p in rec.pending):
                    records[tid] = rec
                    return "pending", None, None, None
                value = orjson.dumps({**rec.data, "pending": [*rec.pending, payload]})
                rev = await claims.update(tid, value, rec.revision)
                if rev is not None:
                    records[tid] = Record(orjson.loads(value), rev)
                    return "pending", None, None, None
                continue
            state = FeedbackState.from_dict(rec.data.get("feedback", {}))
            if ev.feedback_id in state.feedback_ids:
                records[tid] = rec
                return "already", Scored(rec.data["reward"]), state, rec
            state.apply(ev.type, ev.rating, ev.feedback_id, correction_of(payload))
            reward = rescore_with_feedback(rec.data["reward"], state, self.state, self.config)
            value = claims.scored(reward.to_json(), state.to_dict(), reward.version, time.time())
            rev = await claims.update(tid, value, rec.revision)
            if rev is not None:
                records[tid] = Record(orjson.loads(value), rev)
                return "applied", reward, state, rec
        raise TransientError(f"the shared reward record of {tid} kept changing; retried")


STREAM_CHECK_MARGIN_S = 5.0  # clock skew and commit-to-publish delay, in seconds


async def published_reward_ids(bus: Bus, since: float, timeout: float = 2.0) -> set[str]:
    """The message ids (= reward ids) the reward stream holds from `since` (unix seconds) on.

    Reads headers only, through an ephemeral consumer that the server deletes by itself."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    stamp = datetime.fromtimestamp(max(since, 0.0), UTC)
    sub = await bus.js.pull_subscribe(
        REWARD,
        stream="RL_REWARDS",
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME,
            opt_start_time=stamp,
            ack_policy=AckPolicy.NONE,
            headers_only=True,
            inactive_threshold=30.0,
            filter_subject=REWARD,
        ),
    )
    out: set[str] = set()
    try:
        pending = int((await sub.consumer_info()).num_pending or 0)
        seen = 0
        while seen < pending:
            try:
                msgs = await sub.fetch(min(5000, pending - seen), timeout=timeout)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            seen += len(msgs)
            out.update((m.headers or {}).get("Nats-Msg-Id", "") for m in msgs)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if seen < pending:
        raise RuntimeError(f"read {seen} of {pending} reward message ids back")
    return out


def _first_error(group: BaseExceptionGroup) -> BaseException:  # type: ignore[type-arg]
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        return exc
    return group


def config_path(settings: Settings) -> Path | None:
    """The reward config `agentrl up` uses: $AGENTRL_REWARDS_CONFIG, else
    <data_dir>/rewards.yaml when it exists, else the defaults."""
    env = os.environ.get("AGENTRL_REWARDS_CONFIG")
    if env:
        return Path(env)
    candidate = Path(settings.data_dir) / "rewards.yaml"
    return candidate if candidate.exists() else None


async def serve(bus: Bus, stop: asyncio.Event, settings: Settings) -> None:
    """The entry point `agentrl up` starts (agentrl.app.stack.SERVICES)."""
    config = RewardConfig.load(config_path(settings))
    await run_reward_service(bus, stop, config=config, data_dir=settings.data_dir)


async def run_reward_service(
    bus: Bus,
    stop: asyncio.Event | None = None,
    *,
    config: RewardConfig | str | Path | None = None,
    data_dir: str | Path | None = None,
    **kwargs: Any,
) -> RewardService:
    """Run the reward service on `bus` until `stop` is set (what `agentrl up` starts)."""
    cfg = config if isinstance(config, RewardConfig) else RewardConfig.load(config)
    service = RewardService(bus, cfg, data_dir, **kwargs)
    await service.run(stop)
    return service
