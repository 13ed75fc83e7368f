"""The training service: triggers, a durable job queue, jobs in child processes, status events.

    agent.rl.reward.v1            -> threshold trigger  -+
    cron (croniter, UTC)          -> schedule trigger   -+-> agent.rl.training.request.v1
    API / CLI / NATS              -> manual             -+        |
                                                                  v
    request consumer -> SQLite job table (queued) -> scheduler (priority, FIFO, one job per
    device) -> `python -m agentrl.training.worker` -> events.jsonl -> agent.rl.training.status.v1
                                                                     + KV bucket agentrl_training

Every state change is committed to SQLite together with the event that announces it (the
outbox), then published. After a restart, a job that was running resumes from its last
checkpoint (up to `max_resumes` times) or ends as failed INFRA; requests and status events
committed but not published are published from the outbox first. A request with a known job
id (a redelivery) never starts a second job.

A failure in one scheduler round (NATS away longer than the publish retry window) is logged,
counted and retried with backoff; every state change is committed, so nothing is lost. An
inner task that ends anyway ends `run()` with an error naming it, so the stack's supervisor
restarts the service and its health shows why.

Several runners (one per host, or `AGENTRL_REPLICA_ID` apart on one host) share one queue:
the request consumer is shared, each accepted job goes into the KV queue
(`agentrl.training.queue`), and a runner with a free device takes the next job by taking its
lease, renewed while the job runs. A runner that dies loses its leases; another takes the job
and resumes it from the newest checkpoint in the shared checkpoint root. The SQLite file is
each runner's own record (outbox, what it ran), not the queue. Triggers: every runner counts
the rewards (a consumer of its own) and one, the holder of the trigger lease, fires; firing
ids are deterministic and intake is create-only, so a firing published twice is one job.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import secrets
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from agentrl.bus import Bus, Delivery, PermanentError, TransientError
from agentrl.bus.lease import Lease, lease_bucket, while_leader
from agentrl.contracts.base import new_id, utcnow
from agentrl.contracts.filters import declared
from agentrl.contracts.subjects import REWARD, TRAINING_REQUEST, TRAINING_STATUS, TRAJECTORY
from agentrl.contracts.training import TrainingRequest, TrainingStatus
from agentrl.core.deathsig import die_with_parent
from agentrl.core.settings import Settings, get_settings
from agentrl.llm.fence import raise_fence
from agentrl.observability import instrument as obs
from agentrl.training.jobspec import JobSpec
from agentrl.training.kv import CANCEL_SUBJECT, STATUS_BUCKET, bucket
from agentrl.training.launcher import LaunchedJob, OwnLauncher, launch
from agentrl.training.paths import UnsafePath, checkpoint_base, job_dir
from agentrl.training.queue import FINAL, JobQueue, QueueEntry, status_of
from agentrl.training.requests import defaults, job_kind, merge
from agentrl.training.settings import TrainingSettings
from agentrl.training.store import PRIORITY_RANK, JobRow, Store
from agentrl.training.triggers import (
    Clock,
    CronSchedule,
    ThresholdState,
    count_rewards,
    trigger_id,
    utc_clock,
)

log = logging.getLogger(__name__)

PLATFORM = "agentrl-training-v1"
# What a job reports about its data; published in the status's metadata.
LINEAGE_TTL_S = 2.0
DATA_KEYS = (
    "dataset",
    "samples",
    "exact_token_samples",
    "trained_samples",
    "objective",
    "init_checkpoint",
    "pairs",
    "grouped_trajectories",
    "baseline_trajectories",
    "resumed_from",
    "optimizer_steps",
    "stages_s",  # where a job's seconds went (hint sampling, RL, replay, hint training, save)
)
UUID_RE = re.compile(r"^[0-9a-fA-F-]{8,64}$")
# Backoff of the scheduler after a failed round (NATS away): doubles up to the last value.
SCHEDULER_BACKOFF_S = (0.5, 30.0)
# How long a runner owns a job (or the triggers) without renewing: a runner that dies gives
# its jobs up this long after its last renewal (renewed every third of it).
LEASE_TTL_S = 10.0
# A job another runner holds is looked at again after this part of the lease TTL (it cannot
# come free sooner unless it ends, and then it leaves the queue).
ELSEWHERE_RETRY_TTL = 0.5


def validation_reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err["loc"]) or "<payload>"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid training request: " + "; ".join(parts)


def latest_step_checkpoint(storage_path: str) -> str | None:
    """The newest complete step-* checkpoint under `storage_path` (manifest present)."""
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(storage_path)
        names = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    except (FileNotFoundError, OSError):
        return None
    steps = [n for n in names if n.startswith("step-") and fs.exists(f"{root}/{n}/manifest.json")]
    return f"{storage_path.rstrip('/')}/{steps[-1]}" if steps else None


class RunningJob:
    """A job process and what the service knows about it."""

    def __init__(
        self, row: JobRow, proc: asyncio.subprocess.Process | LaunchedJob, job_dir: Path
    ) -> None:
        self.row = row
        self.proc = proc
        self.job_dir = job_dir
        self.started = time.monotonic()
        self.last_progress = time.monotonic()
        self.work = -1.0  # the heartbeats' work count (`Emitter.count_work`) seen last
        self.cancel_requested = False
        self.final: dict[str, Any] | None = None
        self.latest: dict[str, Any] = {}
        self.peak_rss = 0.0
        self.peak_gpu = 0.0
        self.offset = 0
        self.train_s = 0.0
        self.slot = 0


class TrainingService:
    """One training service; `await service.run(stop)` until `stop` is set."""

    def __init__(
        self,
        bus: Bus,
        settings: Settings | None = None,
        tsettings: TrainingSettings | None = None,
        *,
        clock: Clock = utc_clock,
        durable: str = "training",
        poll_s: float = 0.1,
        cron_poll_s: float = 1.0,
        replica_id: str | None = None,
        lease_ttl_s: float | None = None,
        scan_s: float = 1.0,
    ) -> None:
        self.bus = bus
        self.settings = settings or get_settings()
        self.ts = tsettings or TrainingSettings()
        rid = replica_id or os.environ.get("AGENTRL_REPLICA_ID") or None
        base = Path(self.settings.data_dir).resolve() / "training"
        # Replicas on one host keep their own records apart; checkpoints stay shared.
        self.root = base / "replicas" / _slug(rid) if rid else base
        # `name` is the runner (stable across restarts: its consumers and records); `owner`
        # names this process in leases, unique per process like the controller's: two
        # runners of one name (a fixed hostname and the same path in two containers) must
        # never both take a job, and `Lease.acquire` treats its own owner's lease as its own
        self.name = rid or f"{socket.gethostname()}-{_digest(str(self.root))}"
        self.owner = f"{self.name}-{os.getpid()}-{secrets.token_hex(3)}"
        self.suffix = _slug(self.name)
        self.lease_ttl_s = lease_ttl_s or float(
            os.environ.get("AGENTRL_TRAINING_LEASE_TTL_S") or LEASE_TTL_S
        )
        self.scan_s = scan_s
        self.store = Store(self.root / "state.sqlite")
        self.clock = clock
        self.durable = durable
        self.poll_s = poll_s
        self.cron_poll_s = cron_poll_s
        self.running: dict[str, RunningJob] = {}
        self.wake = asyncio.Event()
        self.kv: Any = None
        self.queue: JobQueue | None = None
        self.lease_kv: Any = None
        self.job_leases: dict[str, Lease] = {}
        self.trigger_owner = False
        self._elsewhere: dict[str, float] = {}  # job id -> when to look at it again
        self._requeued: set[str] = set()  # resumed by this runner, not started yet
        self._last_scan = 0.0
        self.counters: dict[str, int] = {
            "requests": 0,
            "duplicates": 0,
            "invalid": 0,
            "threshold_triggers": 0,
            "schedule_triggers": 0,
            "completed": 0,
            "failed": 0,
            "cancelled": 0,
            "scheduler_errors": 0,
            "progress_dropped": 0,
            "adopted": 0,
            "leases_lost": 0,
            "leases_expired": 0,
            "fenced_writes": 0,
            "forked_jobs": 0,
        }
        self.fired: Counter[str] = Counter()  # threshold jobs fired per key, this run
        # jobs fork from a launcher that imported torch once (agentrl.training.launcher):
        # one given by its socket, else one of this service's own (`warm_worker`)
        self.own_launcher = (
            OwnLauncher(
                _launcher_path(), self.root / "launcher.log", self._job_env(), die_with_parent
            )
            if self.ts.warm_worker and not self.ts.launcher
            else None
        )
        self._flush_lock = asyncio.Lock()
        self._flush_error: Exception | None = None
        self.schedule = CronSchedule(self.ts.schedule, clock) if self.ts.schedule else None
        self._torch_version = _version("torch")
        # lineages (`agentrl.release.lineage`, threshold_scope="lineage"): the deployment
        # registry's lineage table, re-read at most every LINEAGE_TTL_S
        self.registry_bucket = os.environ.get("AGENTRL_DEPLOY_BUCKET") or "agentrl_models"
        self.default_lineage = os.environ.get("AGENTRL_DEPLOY_PUBLIC_MODEL") or "agentrl-policy"
        self._routing: Any = None
        self._routing_at = 0.0

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await self.bus.ensure_streams()
        self.kv = await self._kv()
        self.queue = await JobQueue.open(self.bus.js)
        self.lease_kv = await lease_bucket(
            self.bus.js, self.lease_ttl_s, self.settings.stream_replicas
        )
        await self._flush_outbox()
        await self.recover()
        if self.own_launcher is not None:
            await self.own_launcher.start()
        triggers = Lease(
            self.lease_kv, f"training.{_slug(self.durable)}.triggers", self.owner, self.lease_ttl_s
        )
        tasks = [
            asyncio.create_task(self._consume_requests(stop), name="training-requests"),
            asyncio.create_task(self._consume_cancels(stop), name="training-cancels"),
            asyncio.create_task(self._scheduler(stop), name="training-scheduler"),
            asyncio.create_task(self._renew_jobs(stop), name="training-leases"),
            asyncio.create_task(self._watch_leases(stop), name="training-lease-watchdog"),
            asyncio.create_task(
                while_leader(triggers, self._own_triggers, stop), name="training-trigger-lease"
            ),
        ]
        if self.ts.threshold > 0:
            tasks.append(
                asyncio.create_task(self._consume_rewards(stop), name="training-threshold")
            )
            if self.ts.threshold_scope != "global":
                tasks.append(asyncio.create_task(self._index_trajectories(stop)))
        if self.schedule is not None:
            tasks.append(asyncio.create_task(self._cron(stop), name="training-cron"))
        log.info("training service started (%d devices)", len(self.ts.devices))
        stopped = asyncio.create_task(stop.wait(), name="training-stop")
        try:
            done, _ = await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():  # an inner task ended on its own: the service is broken
                task = next(t for t in tasks if t in done)
                exc = None if task.cancelled() else task.exception()
                raise RuntimeError(
                    f"training service task {task.get_name()} ended"
                    + (f": {type(exc).__name__}: {exc}" if exc else " unexpectedly")
                ) from exc
        finally:
            for t in (stopped, *tasks):
                t.cancel()
            await asyncio.gather(stopped, *tasks, return_exceptions=True)
            await self._stop_jobs()
            self.store.close()

    async def _kv(self) -> Any:
        return await bucket(self.bus.js, STATUS_BUCKET)

    async def _stop_jobs(self) -> None:
        """On shutdown, stop job processes; their rows stay 'running' so the next start
        resumes them from their checkpoints (or fails them). Their leases are kept: this
        runner takes them back when it starts again, another one when they expire."""
        for job in list(self.running.values()):
            with contextlib.suppress(ProcessLookupError):
                job.proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(job.proc.wait(), 5)
        if self.own_launcher is not None:
            await self.own_launcher.stop()

    async def _own_triggers(self, leader_stop: asyncio.Event) -> None:
        """While this runner holds the trigger lease it fires (the others only count)."""
        self.trigger_owner = True
        try:
            if self.ts.threshold > 0:
                # firings counted while another runner fired, or a job that ended while down
                with contextlib.suppress(Exception):
                    await self.fire_deferred()
            await leader_stop.wait()
        finally:
            self.trigger_owner = False

    async def recover(self) -> None:
        """Jobs left 'running' by a stopped or killed service: resume or fail (INFRA) the
        ones whose lease is still ours; the others moved to another runner meanwhile."""
        for row in self.store.jobs("running"):
            if row.pid:
                _kill_stale(row.pid)
            if not await self._claim(row.job_id):
                continue
            await self._resume_or_fail(row)

    async def _resume_or_fail(self, row: JobRow) -> None:
        """A job whose runner stopped: queued again from its newest checkpoint, or from the
        start when it wrote none (a job kind without step checkpoints, or one that died
        early), up to `max_resumes` times; then failed INFRA."""
        try:
            storage = self._storage_path(row)
        except UnsafePath as exc:  # a row from before ids and paths were checked
            await self._finish(row, "failed", error={"code": "CONFIG", "message": str(exc)})
            return
        ckpt = latest_step_checkpoint(storage)
        if row.resumes < self.ts.max_resumes:
            log.info(
                "job %s resumes from %s",
                row.job_id,
                ckpt or "the start (no checkpoint)",
                extra={"job_id": row.job_id},
            )
            await self._count_resume(row.job_id, row.resumes + 1)
            self._requeued.add(row.job_id)
            where = {"resume_from": ckpt} if ckpt else {"restarted": "no step checkpoint"}
            await self._publish_status(
                row.job_id,
                "queued",
                extra={**where, "resumes": row.resumes + 1, "runner": self.name},
                fields={"status": "queued", "resumes": row.resumes + 1, "pid": None},
            )
        else:
            why = f"it already resumed {row.resumes} times"
            await self._finish(
                row,
                "failed",
                error={
                    "code": "INFRA",
                    "message": "the training service stopped while this job was running and "
                    f"it cannot resume ({why}); start it again",
                },
                artifacts={"last_checkpoint": ckpt} if ckpt else None,
            )

    # -- the shared queue and the leases ------------------------------------------------------

    async def _claim(self, job_id: str) -> QueueEntry | None:
        """Take a job's lease. Its queue entry when it is ours to run now; None when another
        runner holds it (looked at again later) or it has ended (this runner's record then
        follows the job's status)."""
        assert self.queue is not None
        lease = self.job_leases.get(job_id) or Lease(
            self.lease_kv, f"job.{job_id}", self.owner, self.lease_ttl_s
        )
        if not await lease.acquire():
            self._elsewhere[job_id] = time.monotonic() + self.lease_ttl_s * ELSEWHERE_RETRY_TTL
            return None
        entry = await self.queue.get(job_id)
        status = await status_of(self.kv, job_id)
        ended = status is not None and status.get("status") in FINAL
        row = self.store.get(job_id)
        if entry is None and not ended and row is not None and row.status in ("queued", "running"):
            # a job accepted before the queue existed (an older version): queue it now
            entry = QueueEntry(
                job_id, row.request, row.kind, row.priority, row.created, row.resumes
            )
            if not await self.queue.add(entry):
                entry = await self.queue.get(job_id)
        if entry is None or ended:
            if entry is not None:
                await self.queue.remove(job_id)
            await lease.release()
            self.job_leases.pop(job_id, None)
            self._settle(job_id, status)
            return None
        self.job_leases[job_id] = lease
        self._elsewhere.pop(job_id, None)
        return entry

    def _settle(self, job_id: str, status: dict[str, Any] | None) -> None:
        """This runner's record of a job another runner has (or had): its final status, or
        'moved' while it is queued or running elsewhere."""
        row = self.store.get(job_id)
        if row is None or row.status in FINAL:
            return
        final = status.get("status") if status else None
        self.store.update(job_id, status=final if final in FINAL else "moved", pid=None)

    async def _count_resume(self, job_id: str, resumes: int) -> None:
        """Record a resume in the queue entry, so every runner counts it against max_resumes."""
        if self.queue is None:
            return
        for _ in range(3):
            entry = await self.queue.get(job_id)
            if entry is None or entry.resumes >= resumes:
                return
            entry.resumes = resumes
            if await self.queue.update(entry):
                return

    async def _ended(self, job_id: str) -> None:
        """After a job's final status is published: out of the queue, lease given up."""
        if self.queue is not None:
            await self.queue.remove(job_id)
        lease = self.job_leases.pop(job_id, None)
        if lease is not None:
            with contextlib.suppress(Exception):
                await lease.release()

    async def _candidates(self) -> list[str]:
        """Job ids to try, in scheduling order: this runner's queued jobs, and every `scan_s`
        the shared queue's (jobs other runners accepted, or lost)."""
        order: dict[str, tuple[int, float, str]] = {
            r.job_id: (r.priority, r.created, r.job_id) for r in self.store.jobs("queued")
        }
        if self.queue is not None and time.monotonic() - self._last_scan >= self.scan_s:
            self._last_scan = time.monotonic()
            for e in await self.queue.entries():
                order.setdefault(e.job_id, e.order())
        now = time.monotonic()
        ids = [j for j in order if j not in self.running and self._elsewhere.get(j, 0.0) <= now]
        return sorted(ids, key=order.__getitem__)

    async def _take(self, job_id: str, slot: int) -> bool:
        """Claim a job and start it on `slot`; a job whose runner died resumes from its
        checkpoint. False when it is not ours to run."""
        entry = await self._claim(job_id)
        if entry is None:
            return False
        row = self.store.get(job_id)
        if row is None:
            priority = str(entry.request.get("priority") or "normal")
            self.store.add_job(job_id, priority, entry.kind, entry.request)
            row = self.store.get(job_id)
            assert row is not None
        status = await status_of(self.kv, job_id)
        state = (status or {}).get("status")
        if row.status not in ("queued", "running") or entry.resumes > row.resumes:
            self.store.update(job_id, status="queued", resumes=max(row.resumes, entry.resumes))
            row = self.store.get(job_id)
            assert row is not None
        if (state == "running" or row.status == "running") and job_id not in self._requeued:
            # its runner died (the lease expired): resume it here, or fail it
            self.counters["adopted"] += 1
            log.info("job %s: its runner stopped; %s takes it", job_id, self.owner)
            await self._resume_or_fail(row)
            row = self.store.get(job_id)
            if row is None or row.status != "queued":
                return False
        self._requeued.discard(job_id)
        await self._start(row, slot)
        return job_id in self.running

    async def _renew_jobs(self, stop: asyncio.Event) -> None:
        """Renew the lease of every job this runner holds; a lost lease (away longer than
        the TTL: another runner has the job now) stops the job here without a word; a
        cancel flagged in the queue by another runner is carried out."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.lease_ttl_s / 3)
            for job_id, lease in list(self.job_leases.items()):
                expired = False
                try:  # never past the lease's end: the watchdog acts then
                    ok = await asyncio.wait_for(lease.renew(), max(0.05, lease.left_s))
                except Exception as exc:
                    # NATS away or slow: the job goes on while the lease's TTL lasts (then
                    # it stops: another runner may take it from that moment)
                    log.info("lease of job %s not renewed: %s", job_id, exc)
                    ok = lease.held
                    expired = not ok
                if not ok and self.job_leases.get(job_id) is lease:
                    self._lost(job_id, expired=expired)
                    continue
                job = self.running.get(job_id)
                if job is None or job.cancel_requested or self.queue is None:
                    continue
                with contextlib.suppress(Exception):
                    entry = await self.queue.get(job_id)
                    if entry is not None and entry.cancel:
                        await self.cancel(job_id)

    async def _watch_leases(self, stop: asyncio.Event) -> None:
        """Stop every job whose lease ran out unrenewed (NATS cut off from this runner,
        or too slow to answer): once its TTL passed since the last renewal the server may
        hand the job to another runner, so this one must not train on. Looks often and
        asks nothing of NATS: it acts however stuck the renewals are."""
        period = min(0.25, self.lease_ttl_s / 12)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)
            for job_id in list(self.running):
                lease = self.job_leases.get(job_id)
                if lease is not None and not lease.held and await self._last_chance(lease):
                    log.info("job %s: lease renewed late (this process was held up)", job_id)
                if lease is None or not lease.held:
                    self._lost(job_id, expired=True)

    async def _last_chance(self, lease: Lease) -> bool:
        """One renewal, at once, of a lease that ran out unrenewed. A process held up longer
        than the TTL (a busy host, a blocked event loop) gets it back when nobody took the
        job meanwhile (compare-and-set: safe, and writes stay fenced), instead of killing a
        healthy job; a runner cut off from NATS gets no answer within the grace, a moment
        against the TTL, and stops its job."""
        try:
            return await asyncio.wait_for(lease.renew(), min(1.0, self.lease_ttl_s / 6))
        except Exception:
            return False

    def _lost(self, job_id: str, *, expired: bool = False) -> None:
        self.counters["leases_expired" if expired else "leases_lost"] += 1
        self.job_leases.pop(job_id, None)
        job = self.running.pop(job_id, None)
        if job is not None:
            if expired:
                log.warning(
                    "job %s: lease not renewed within its TTL (%.1fs): stopped here (another "
                    "runner may own it now)",
                    job_id,
                    self.lease_ttl_s,
                )
            else:
                log.warning("job %s: lease lost, another runner has it; stopped here", job_id)
            _kill(job.proc)
        self._settle(job_id, None)
        self.wake.set()

    # -- requests ---------------------------------------------------------------------------

    async def _consume_requests(self, stop: asyncio.Event) -> None:
        await self.bus.consume(
            TRAINING_REQUEST,
            self.durable,
            self.handle_request,
            stop=stop,
            validate=False,
            batch=32,
            ack_wait=30,
        )

    async def handle_request(self, data: bytes) -> None:
        """Validate, persist as queued (once per job id), announce. Invalid: failed status
        naming the field, then dead-letter."""
        try:
            req = TrainingRequest.model_validate_json(data)
        except ValidationError as exc:
            self.counters["invalid"] += 1
            reason = validation_reason(exc)
            job_id = _job_id_of(data)
            if job_id and self.store.get(job_id) is None:
                await self._publish_status(
                    job_id, "failed", error={"code": "CONFIG", "message": reason}
                )
            raise PermanentError(reason) from exc
        try:
            checkpoint_base(self._requested_storage(req.model_dump(mode="json")), *self._roots())
            flt = declared(req.training_config.dataset.filter)
            lineage = (req.metadata.model_extra or {}).get("lineage")
            if lineage and job_kind(req) == "dataset" and not flt.agent_ids:
                raise ValueError(
                    f"a job of lineage {lineage!r} must name its agents (dataset.filter."
                    "agent_ids): without them it would read every lineage's trajectories"
                )
        except ValueError as exc:  # UnsafePath too
            self.counters["invalid"] += 1
            reason = f"invalid training request: {exc}"
            if self.store.get(req.training_job_id) is None:
                await self._publish_status(
                    req.training_job_id, "failed", error={"code": "CONFIG", "message": reason}
                )
            raise PermanentError(reason) from exc
        kind = job_kind(req)
        if self.store.get(req.training_job_id) is None and self.queue is not None:
            # one job per id across runners: known to the status bucket (it ran, or runs),
            # or already in the shared queue
            entry = QueueEntry(
                req.training_job_id,
                req.model_dump(mode="json"),
                kind,
                PRIORITY_RANK.get(req.priority, 2),
            )
            known = await status_of(self.kv, req.training_job_id) is not None
            if known or not await self.queue.add(entry):
                self.counters["duplicates"] += 1
                log.info("request %s already known: not started again", req.training_job_id)
                return
        # the row does not exist yet: the queued status names the lineage from the request
        # (else the deployment's fleet read it as the default lineage's job)
        lineage = (req.metadata.model_extra or {}).get("lineage") if req.metadata else None
        extra = {"kind": kind, **({"lineage": str(lineage)} if lineage else {})}
        event = self.build_status(req.training_job_id, "queued", extra=extra)
        added = self.store.add_job(
            req.training_job_id,
            req.priority,
            kind,
            req.model_dump(mode="json"),
            outbox=[_outbox_row(self.bus, event)],
        )
        if not added:
            self.counters["duplicates"] += 1
            log.info("request %s already known: not started again", req.training_job_id)
            return
        self.counters["requests"] += 1
        self.wake.set()
        await self._try_flush()  # committed with the job: else the scheduler publishes it

    # -- cancel -----------------------------------------------------------------------------

    async def _consume_cancels(self, stop: asyncio.Event) -> None:
        await self.bus.consume(
            CANCEL_SUBJECT, f"{self.durable}-cancel", self.handle_cancel, stop=stop, validate=False
        )

    async def handle_cancel(self, data: bytes) -> None:
        try:
            job_id = str(orjson.loads(data)["training_job_id"])
        except Exception as exc:
            raise PermanentError(f"cancel message without training_job_id: {exc}") from exc
        await self.cancel(job_id)

    async def cancel(self, job_id: str) -> bool:
        """Cancel a job wherever it is: here (its process is stopped), queued (cancelled
        here, under its lease), or running on another runner (flagged in the queue: that
        runner stops it at its next lease renewal)."""
        job = self.running.get(job_id)
        if job is None and self.queue is not None:
            entry = await self.queue.get(job_id)
            if entry is None:
                return False
            if await self._claim(job_id) is None:
                if job_id in self.job_leases:
                    return False  # it ended meanwhile
                for _ in range(3):  # another runner has it
                    entry = await self.queue.get(job_id)
                    if entry is None:
                        return False
                    entry.cancel = True
                    if await self.queue.update(entry):
                        return True
                return False
            if self.store.get(job_id) is None:
                priority = str(entry.request.get("priority") or "normal")
                self.store.add_job(job_id, priority, entry.kind, entry.request)
        row = self.store.get(job_id)
        if row is None or row.status not in ("queued", "running", "moved"):
            return False
        if job is None:
            await self._finish(
                row, "cancelled", error={"code": "CANCELLED", "message": "cancelled before it ran"}
            )
            return True
        job.cancel_requested = True
        with contextlib.suppress(ProcessLookupError):
            job.proc.send_signal(signal.SIGTERM)
        asyncio.get_running_loop().call_later(self.ts.cancel_grace_s, _kill, job.proc)
        return True

    # -- scheduler and jobs -----------------------------------------------------------------

    async def _scheduler(self, stop: asyncio.Event) -> None:
        """Rounds of: publish what the outbox holds, start queued jobs, poll running ones.
        A failed round (NATS away) is retried with backoff: its state changes are committed
        and their events wait in the outbox."""
        failures = 0
        while not stop.is_set():
            wait = self.poll_s
            try:
                await self._schedule_round()
                failures = 0
            except Exception as exc:
                failures += 1
                self.counters["scheduler_errors"] += 1
                first, cap = SCHEDULER_BACKOFF_S
                wait = min(first * 2 ** (failures - 1), cap)
                log.warning(
                    "training scheduler round failed (%d in a row), retrying in %.1fs: %s: %s",
                    failures,
                    wait,
                    type(exc).__name__,
                    exc,
                )
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait() if not failures else stop.wait(), wait)

    async def _schedule_round(self) -> None:
        """One round; raises at its end when the outbox could not be published (NATS away),
        after starting and polling jobs anyway (their changes are committed)."""
        if self.store.outbox_size():
            await self._try_flush(force=True)
        busy = {j.slot for j in self.running.values()}
        free = [i for i in range(len(self.ts.devices)) if i not in busy]
        taking: Exception | None = None
        try:  # the shared queue needs NATS; the jobs here are polled without it
            if free:
                for job_id in await self._candidates():
                    if not free:
                        break
                    if await self._take(job_id, free[0]):
                        free.pop(0)
        except Exception as exc:
            taking = exc
        for job in list(self.running.values()):
            await self._poll(job)
        obs.training_queue(len(self.store.jobs("queued")), len(self.running))
        if taking is not None:
            raise taking
        if self._flush_error is not None and self.store.outbox_size():
            raise self._flush_error

    @staticmethod
    def _requested_storage(request: dict[str, Any]) -> str | None:
        value = (request.get("training_config") or {}).get("checkpointing", {}).get("storage_path")
        return str(value) if value else None

    def _roots(self) -> tuple[TrainingSettings, Path]:
        return self.ts, Path(self.settings.data_dir)

    def _storage_path(self, row: JobRow) -> str:
        """The job's checkpoint folder (raises UnsafePath outside the allowed roots); a
        lineage's job keeps its checkpoints under `lineages/<lineage>/`."""
        base = checkpoint_base(self._requested_storage(row.request), *self._roots())
        job_dir(self.root, row.job_id)  # the id is a safe folder name
        lineage = _lineage_of_request(row.request)
        if lineage:
            return f"{base.rstrip('/')}/lineages/{_slug(lineage)}/{row.job_id}"
        return f"{base.rstrip('/')}/{row.job_id}"

    async def _start(self, row: JobRow, slot: int) -> None:
        device = self.ts.devices[slot]
        try:
            folder = job_dir(self.root, row.job_id)
            storage_path = self._storage_path(row)
        except UnsafePath as exc:  # checked at intake too: a row written before the checks
            await self._finish(row, "failed", error={"code": "CONFIG", "message": str(exc)})
            return
        folder.mkdir(parents=True, exist_ok=True)
        lease = self.job_leases.get(row.job_id)
        if lease is None or lease.token is None or not lease.held:
            return  # not ours (any more): the scheduler looks at it again
        try:
            newer = await asyncio.to_thread(raise_fence, storage_path, self.owner, lease.token)
        except Exception as exc:  # a store that cannot be written: the job fails on it (INFRA)
            log.warning("job %s: no fence in %s: %s", row.job_id, storage_path, exc)
            newer = None
        if newer is not None:  # another runner took the job after us: we are stale
            log.warning("job %s: %s owns it now; not started here", row.job_id, newer["owner"])
            self._lost(row.job_id)
            return
        resume = row.resumes > 0
        recent = self.store.get_state("recent_checkpoint") or {}
        same_base = recent.get("base_model") == row.request.get("training_config", {}).get(
            "base_model"
        )
        try:  # the request validated here, once; a row written before today's checks fails
            spec = JobSpec(
                request=row.request,  # type: ignore[arg-type]
                kind=row.kind,  # type: ignore[arg-type]
                job_dir=str(folder),
                nats_url=self._nats_url(),
                device=device,
                storage_path=storage_path,
                resume=resume,
                status_every_steps=self.ts.status_every_steps,
                heartbeat_s=self.ts.heartbeat_s,
                max_length=self.ts.max_length,
                tiny_kwargs=self.ts.tiny_kwargs,
                lease={"owner": self.owner, "token": lease.token},
                recent_checkpoint=recent.get("path") if same_base else None,
            )
        except ValueError as exc:
            await self._finish(row, "failed", error={"code": "CONFIG", "message": str(exc)})
            return
        (folder / "spec.json").write_text(spec.model_dump_json(indent=2, exclude_none=True))
        events = folder / "events.jsonl"
        offset = events.stat().st_size if events.exists() else 0
        env = self._job_env()
        if device.startswith("cuda:"):
            env["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
            spec.device = "cuda"
            (folder / "spec.json").write_text(spec.model_dump_json(indent=2, exclude_none=True))
        proc: asyncio.subprocess.Process | LaunchedJob | None = await self._fork(folder, env)
        if proc is not None:
            self.counters["forked_jobs"] += 1
        else:
            log_fh = open(folder / "process.log", "ab")  # noqa: SIM115 - handed to the child
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "agentrl.training.worker",
                    str(folder),
                    stdout=log_fh,
                    stderr=log_fh,
                    stdin=asyncio.subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    # a runner SIGKILLed leaves no job writing checkpoints beside the one
                    # that resumes it elsewhere
                    preexec_fn=die_with_parent,
                )
            except OSError as exc:
                await self._finish(
                    row,
                    "failed",
                    error={"code": "INFRA", "message": f"cannot start the job process: {exc}"},
                )
                return
            finally:
                with contextlib.suppress(Exception):
                    log_fh.close()
        row.status, row.device = "running", device
        job = RunningJob(row, proc, folder)
        job.offset = offset
        job.slot = slot
        try:  # listed as running here once its running status is out (or in the outbox)
            await self._publish_status(
                row.job_id,
                "running",
                job=job,
                extra={"device": device, "resumed": resume, "runner": self.name},
                fields={
                    "status": "running",
                    "device": device,
                    "pid": proc.pid,
                    "job_dir": str(folder),
                },
            )
        finally:
            self.running[row.job_id] = job

    async def _fork(self, folder: Path, env: dict[str, str]) -> LaunchedJob | None:
        """The job's process forked by the launcher; None when there is none or it cannot
        be reached (the caller starts a process of its own; a dead own launcher is started
        again for the next job)."""
        path = self.ts.launcher or (self.own_launcher.path if self.own_launcher else None)
        if not path:
            return None
        try:
            return await launch(path, folder, env)
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning(
                "job launcher %s unavailable (%s): the job starts its own process", path, exc
            )
            if self.own_launcher is not None:
                await self.own_launcher.start()
            return None

    def _job_env(self) -> dict[str, str]:
        """A job process's environment: the service's, its data dir and credentials."""
        env = {**os.environ, "AGENTRL_DATA_DIR": str(self.settings.data_dir)}
        for name in (
            "nats_user",
            "nats_password",
            "nats_token",
            "nats_tls_ca",
            "api_host",
            "api_port",
        ):
            value = getattr(self.settings, name, None)
            if value is not None:  # the job connects with the service's credentials
                env[f"AGENTRL_{name.upper()}"] = str(value)
        if self.settings.api_tokens:
            env["AGENTRL_API_TOKENS"] = json.dumps(self.settings.api_tokens)
        return env

    async def _poll(self, job: RunningJob) -> None:
        """Read new events of a job; publish progress; finish it when its process ended."""
        path = job.job_dir / "events.jsonl"
        lines: list[bytes] = []
        if path.exists():
            with open(path, "rb") as fh:
                fh.seek(job.offset)
                chunk = fh.read()
            end = chunk.rfind(b"\n") + 1
            job.offset += end
            lines = chunk[:end].splitlines()
        for line in lines:
            try:
                ev = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            job.peak_rss = max(job.peak_rss, float(ev.get("peak_rss_gb") or 0.0))
            job.peak_gpu = max(job.peak_gpu, float(ev.get("peak_gpu_gb") or 0.0))
            if "train_s" in ev:
                job.train_s = float(ev["train_s"])
            status = ev.get("status")
            if status == "heartbeat":
                # alive is not progress (a hung job's heartbeat thread goes on); a work count
                # that moved is: a stage with no report of its own (a job's hint sampling) ran
                # 15 min at load 13 and was killed as hung
                work = ev.get("work")
                if isinstance(work, int | float) and work > job.work:
                    job.work, job.last_progress = float(work), time.monotonic()
                continue
            job.last_progress = time.monotonic()
            if status == "running":
                job.latest.update({k: v for k, v in ev.items() if k in ("progress", "metrics")})
                job.latest.update({k: v for k, v in ev.items() if k in DATA_KEYS})
                if "progress" in ev or "metrics" in ev:
                    await self._publish_progress(job)
            elif status in ("completed", "failed", "cancelled"):
                job.final = ev
        if job.proc.returncode is None and (
            time.monotonic() - job.last_progress > self.ts.hang_timeout_s
        ):
            log.warning(
                "job %s silent for %.0fs: killing it", job.row.job_id, self.ts.hang_timeout_s
            )
            job.final = {
                "status": "failed",
                "code": "INFRA",
                "message": f"job made no progress for {self.ts.hang_timeout_s:.0f}s (hung); killed",
            }
            _kill(job.proc)
        if job.proc.returncode is None:
            return
        if self.running.get(job.row.job_id) is not job:
            return  # stopped meanwhile (its lease ran out): not concluded here
        await self._poll_tail(job)
        del self.running[job.row.job_id]
        await self._conclude(job)
        self.wake.set()

    async def _poll_tail(self, job: RunningJob) -> None:
        path = job.job_dir / "events.jsonl"
        if not path.exists():
            return
        with open(path, "rb") as fh:
            fh.seek(job.offset)
            rest = fh.read()
        for line in rest.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                ev = orjson.loads(line)
                if ev.get("status") in ("completed", "failed", "cancelled"):
                    job.final = ev

    async def _conclude(self, job: RunningJob) -> None:
        row = self.store.get(job.row.job_id) or job.row
        ev = job.final or {}
        code = job.proc.returncode
        storage = self._storage_path(row)
        last_ckpt = latest_step_checkpoint(storage)
        if job.cancel_requested and ev.get("status") != "completed":
            await self._finish(
                row,
                "cancelled",
                job=job,
                error={"code": "CANCELLED", "message": "cancelled on request"},
                artifacts={"last_checkpoint": last_ckpt} if last_ckpt else None,
            )
        elif ev.get("status") == "completed":
            await self._finish(row, "completed", job=job, final=ev)
        elif ev.get("status") == "failed":
            await self._finish(
                row,
                "failed",
                job=job,
                final=ev,
                error={
                    "code": ev.get("code", "INFRA"),
                    "message": ev.get("message"),
                    "traceback": ev.get("traceback"),
                },
                artifacts={"last_checkpoint": last_ckpt} if last_ckpt else None,
            )
        else:
            how = (
                f"killed by signal {signal.Signals(-code).name}"
                if code is not None and code < 0
                else f"exited with code {code}"
            )
            hint = " (the kernel's OOM killer sends SIGKILL)" if code == -signal.SIGKILL else ""
            await self._finish(
                row,
                "failed",
                job=job,
                error={
                    "code": "INFRA",
                    "message": f"the job process {how}{hint} before it "
                    f"reported a result; see {job.job_dir / 'process.log'}",
                },
                artifacts={"last_checkpoint": last_ckpt} if last_ckpt else None,
            )

    async def _finish(
        self,
        row: JobRow,
        status: str,
        *,
        job: RunningJob | None = None,
        final: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        artifacts: dict[str, Any] | None = None,
    ) -> None:
        final_ckpt = ((final or {}).get("artifacts") or {}).get("final_checkpoint")
        if status == "completed" and final_ckpt:  # what the next job may continue from
            base = row.request.get("training_config", {}).get("base_model")
            self.store.set_state({"recent_checkpoint": {"path": final_ckpt, "base_model": base}})
        self.counters[status] = self.counters.get(status, 0) + 1
        took = time.monotonic() - job.started if job is not None else None
        lineage = _lineage_of_request(row.request) or self.default_lineage
        obs.training_status(status, took, (final or {}).get("samples"), lineage)  # never raises
        await self._publish_status(
            row.job_id,
            status,
            job=job,
            final=final,
            error=error,
            artifacts=artifacts,
            fields={"status": status, "pid": None},
        )
        if self.ts.threshold > 0:
            try:
                await self.fire_deferred()
            except Exception as exc:  # the request is in the outbox: published on the next flush
                log.warning("deferred threshold firing not published yet: %s", exc)

    # -- status events ----------------------------------------------------------------------

    def build_status(
        self,
        job_id: str,
        status: str,
        *,
        job: RunningJob | None = None,
        final: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        artifacts: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> TrainingStatus:
        payload: dict[str, Any] = {
            "training_job_id": job_id,
            "timestamp": utcnow().isoformat(),
            "status": status,
            "metadata": {
                "training_platform": PLATFORM,
                "runner": self.name,
                **({"pytorch_version": self._torch_version} if self._torch_version else {}),
            },
        }
        src = {**(job.latest if job else {}), **(final or {})}
        if "progress" in src:
            payload["progress"] = {k: v for k, v in src["progress"].items() if v is not None}
        if "metrics" in src:
            m = src["metrics"]
            payload["metrics"] = {
                "current": {k: v for k, v in (m.get("current") or {}).items() if v is not None}
            }
            if m.get("best"):
                payload["metrics"]["best"] = {k: v for k, v in m["best"].items() if v is not None}
        if src.get("evaluation_results"):
            payload["evaluation_results"] = {
                k: v for k, v in src["evaluation_results"].items() if v is not None
            }
        arts = {**(src.get("artifacts") or {}), **(artifacts or {})}
        if job is not None:
            arts.setdefault("logs", str(job.job_dir / "job.log"))
        arts = {k: v for k, v in arts.items() if v is not None}
        if arts:
            payload["artifacts"] = arts
        if job is not None:
            payload["resource_usage"] = self._usage(job, final)
        if error:
            payload["error"] = {k: v for k, v in error.items() if v is not None}
        for key in DATA_KEYS:
            if src.get(key) is not None:
                payload["metadata"][key] = src[key]
        lease = self.job_leases.get(job_id)
        if lease is not None and lease.token is not None:  # the status fence's token
            payload["metadata"]["lease_revision"] = lease.token
        row = job.row if job is not None else self.store.get(job_id)
        lineage = _lineage_of_request(row.request) if row is not None else None
        if lineage:  # the deployment registers its checkpoint into this lineage
            payload["metadata"]["lineage"] = lineage
        if extra:
            payload["metadata"].update(extra)
        return TrainingStatus.model_validate(payload)

    def _usage(self, job: RunningJob, final: dict[str, Any] | None) -> dict[str, Any]:
        wall = time.monotonic() - job.started
        gpus = 1 if (job.row.device or "").startswith("cuda") else 0
        hours = wall / 3600
        price = self.ts.gpu_hour_price_usd if gpus else self.ts.cpu_hour_price_usd
        usage: dict[str, Any] = {
            "gpu_hours": round(hours * gpus, 6),
            "peak_memory_gb": round(max(job.peak_rss, job.peak_gpu), 4),
            "total_training_time_seconds": round(wall, 3),
            "peak_rss_gb": round(job.peak_rss, 4),
        }
        if job.peak_gpu:
            usage["peak_gpu_memory_gb"] = round(job.peak_gpu, 4)
        if price is not None:
            usage["cost_usd"] = round(hours * max(gpus, 1) * price, 6)
        if job.train_s:
            usage["train_step_seconds"] = round(job.train_s, 3)
        return usage

    async def _publish_status(
        self, job_id: str, status: str, *, fields: dict[str, Any] | None = None, **kw: Any
    ) -> TrainingStatus:
        """Commit the job's `fields` and its status event (outbox) in one transaction, then
        publish everything the outbox holds. When NATS cannot take it now the event stays in
        the outbox and the scheduler's next round publishes it (one retry window per round,
        not one per event)."""
        event = self.build_status(job_id, status, **kw)
        row = _outbox_row(self.bus, event)
        self.store.update(job_id, outbox=[row], **(fields or {}), last_status=orjson.loads(row[2]))
        await self._try_flush()
        return event

    async def _try_flush(self, force: bool = False) -> bool:
        """Publish the outbox; False (logged, remembered) when NATS cannot take it. Without
        `force`, nothing is tried while an earlier flush has failed (the scheduler retries)."""
        if self._flush_error is not None and not force:
            return False
        try:
            await self._flush_outbox()
        except Exception as exc:
            self._flush_error = exc
            log.warning("status events wait in the outbox (%d): %s", self.store.outbox_size(), exc)
            return False
        self._flush_error = None
        return True

    async def _publish_progress(self, job: RunningJob) -> None:
        """A progress event: best effort (the next one supersedes it), and never ahead of
        status events still waiting in the outbox."""
        if self.store.outbox_size():
            self.counters["progress_dropped"] += 1
            return
        event = self.build_status(job.row.job_id, "running", job=job)
        try:
            if not await self._put_status(job.row.job_id, event.to_json()):
                return
            await self.bus.publish(event)
        except Exception as exc:
            self.counters["progress_dropped"] += 1
            log.info("progress of %s not published: %s", job.row.job_id, exc)
            return
        self.store.update(job.row.job_id, last_status=json.loads(event.to_json()))

    # -- triggers ---------------------------------------------------------------------------

    def new_request(
        self, reason: str, request_id: str, override: dict[str, Any]
    ) -> TrainingRequest:
        base = defaults(self.ts)
        base.update(
            training_job_id=request_id, trigger_reason=reason, timestamp=self.clock().isoformat()
        )
        previous = self.store.get_state("last_trigger_job")
        if previous:
            base["metadata"]["previous_training_job"] = previous
        return TrainingRequest.model_validate(merge(base, override))

    async def _emit_request(self, req: TrainingRequest, state: dict[str, Any]) -> None:
        """Commit trigger state and the request (outbox) together, then publish (or leave it
        to the scheduler's next round when NATS is away)."""
        subject, data, msg_id = self.bus.encode(req)
        self.store.set_state(
            {**state, "last_trigger_job": req.training_job_id}, outbox=[(msg_id, subject, data)]
        )
        self.wake.set()
        await self._try_flush()

    async def _flush_outbox(self) -> None:
        """Publish the outbox in order; a status event also becomes its job's KV entry (the
        API's view) before it leaves the outbox. One flush at a time keeps the order."""
        async with self._flush_lock:
            for msg_id, subject, data in self.store.outbox():
                ended = None
                if subject == TRAINING_STATUS and self.kv is not None:
                    event = orjson.loads(data)
                    job_id = str(event["training_job_id"])
                    if not await self._put_status(job_id, bytes(data)):
                        self.store.outbox_done(msg_id)  # stale: neither state nor event
                        if event.get("status") in FINAL:
                            self.job_leases.pop(job_id, None)
                        continue
                    ended = job_id if event.get("status") in FINAL else None
                await self.bus.publish_raw(subject, bytes(data), msg_id)
                if ended is not None:
                    await self._ended(ended)
                self.store.outbox_done(msg_id)

    async def _put_status(self, job_id: str, data: bytes) -> bool:
        """Write a job's status into the status bucket unless it is fenced: a status whose
        lease revision (`metadata.lease_revision`, the fencing token of the runner that
        wrote it) is older than the one there comes from a runner that lost the job since
        (it was cut off, its outbox flushed later). Compare-and-set, so two runners cannot
        interleave. False: refused (counted, logged)."""
        from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError

        if self.kv is None:
            return True
        token = _lease_revision(data)
        for _ in range(8):
            try:
                entry = await self.kv.get(job_id)
            except (KeyNotFoundError, KeyDeletedError):
                entry = None
            current = _lease_revision(entry.value) if entry is not None and entry.value else 0
            if current > token:
                self.counters["fenced_writes"] += 1
                log.warning(
                    "status of job %s refused: written under lease revision %d, the job's "
                    "status is already at %d (another runner owns it)",
                    job_id,
                    token,
                    current,
                )
                return False
            try:
                if entry is None:
                    await self.kv.create(job_id, data)
                else:
                    await self.kv.update(job_id, data, last=entry.revision)
                return True
            except KeyWrongLastSequenceError:
                continue  # written meanwhile: look again
        raise TransientError(f"status of job {job_id}: the bucket kept changing under us")

    async def _consume_rewards(self, stop: asyncio.Event) -> None:
        await self.bus.consume(
            REWARD,
            f"{self.durable}-threshold-{self.suffix}",
            batch_handler=self.handle_rewards,
            stop=stop,
            validate=False,
            batch=1000,
            ack_wait=60,
            # a reward waits for its trajectory's index (`_index_trajectories`), which lags
            # on a loaded host: ~30 s before a reward whose trajectory never came is
            # dead-lettered, not 5
            max_deliver=30,
        )

    async def handle_rewards(self, batch: list[Delivery]) -> list[BaseException | None]:
        """Count first reward versions per scope, each (trajectory_id, version) once. A reward
        whose trajectory is not indexed yet is nakked alone and counts when it comes back;
        the rest of its batch counts now (one lagging trajectory held back, and after
        `max_deliver` dead-lettered, every reward fetched with it)."""
        from agentrl.training.dataset import reward_version

        state = ThresholdState.from_json(self.store.get_state("threshold"))
        items: list[tuple[str, str, int]] = []
        outcomes: list[BaseException | None] = []
        for d in batch:
            outcomes.append(None)
            try:
                r = orjson.loads(d.data)
                tid = str(r["trajectory_id"])
            except Exception:
                continue  # not a reward: never counted
            try:
                items.append((tid, self._scope_key(tid), reward_version(r)))
            except TransientError as exc:
                outcomes[-1] = exc
        if any(outcomes):
            log.info(
                "%d of %d rewards wait for their trajectories to be indexed",
                sum(1 for o in outcomes if o),
                len(outcomes),
            )
        counted = self.store.counted((tid, v) for tid, _, v in items if v == 1)
        before = set(counted)
        fired = count_rewards(state, items, self.ts.threshold, counted)
        deferred = dict(self.store.get_state("threshold_deferred") or {})
        now = dict(self.store.get_state("threshold_now") or {})
        for key, n in fired:
            previous = self.store.get_state(f"threshold_job:{key}")
            if key not in now and not (previous and await self._active(previous)):
                now[key] = n  # starts a job right after the commit
            else:
                # The scope's last threshold job has not finished: do not pile up jobs (a
                # first start over a long backlog would otherwise queue one per N), but
                # remember the firing: one follow-up job starts when that job ends, so data
                # gathered meanwhile is not lost and the next generation starts at once.
                log.info("threshold reached for %s while its job is active: deferred", key)
                deferred[key] = n
        # Counts, counted rewards and firings in one transaction: a crash after it fires
        # them at the next start, a crash before it counts the batch again.
        self.store.set_state(
            {"threshold": state.to_json(), "threshold_deferred": deferred, "threshold_now": now},
            counted=counted - before,
        )
        if fired:
            try:
                await self.fire_deferred()
            except Exception as exc:  # committed: the outbox or the next firing publishes it
                log.warning("threshold firing not published yet: %s", exc)
        return outcomes

    async def _active(self, job_id: str) -> bool:
        """Whether a job is queued or running on any runner (the status bucket; this
        runner's record when NATS cannot say)."""
        try:
            status = await status_of(self.kv, job_id) if self.kv is not None else None
        except Exception:
            status = None
        if status is not None:
            return status.get("status") not in FINAL
        row = self.store.get(job_id)
        return row is None or row.status in ("queued", "running", "moved")

    async def fire_deferred(self) -> None:
        """Start the committed firings that have no job yet, then the deferred firing of
        every scope whose last job has ended. Only the runner holding the trigger lease
        fires; the others keep their firings for when they hold it."""
        if self.lease_kv is not None and not self.trigger_owner:
            return
        now = dict(self.store.get_state("threshold_now") or {})
        for key, n in list(now.items()):
            del now[key]
            await self._fire_threshold(key, int(n), {"threshold_now": now})
        deferred = dict(self.store.get_state("threshold_deferred") or {})
        for key, n in list(deferred.items()):
            previous = self.store.get_state(f"threshold_job:{key}")
            if previous and await self._active(previous):
                continue
            del deferred[key]
            await self._fire_threshold(key, int(n), {"threshold_deferred": deferred})

    async def _fire_threshold(self, key: str, n: int, state: dict[str, Any]) -> None:
        cap = self.ts.threshold_max_jobs
        if cap and self.fired[key] >= cap:
            # a quick loop needs its first jobs only: the ones after them trained and
            # validated beside its canary for nothing (the firing is dropped, not kept);
            # per key: a lineage that fires first never takes another lineage's jobs
            log.info("threshold reached for %s: %d jobs fired, the cap: not fired", key, cap)
            self.store.set_state(state)
            return
        override: dict[str, Any] = {}
        if self.ts.threshold_scope == "domain":
            override = {"training_config": {"dataset": {"filter": {"task_domains": [key]}}}}
        elif self.ts.threshold_scope == "agent":
            override = {"training_config": {"dataset": {"filter": {"agent_ids": [key]}}}}
        elif self.ts.threshold_scope == "lineage":
            found = await self._lineage_override(key)
            if found is None:  # retired, paused or no agent of its own: not fired
                self.store.set_state(state)
                return
            override = found
        notes = f"{self.ts.threshold} new rewarded trajectories" + (
            f" ({self.ts.threshold_scope} {key})" if key != "*" else ""
        )
        req = self.new_request(
            "threshold_reached",
            trigger_id("threshold", self.ts.threshold_scope, key, n),
            merge(
                override,
                {"requester": "agentrl-threshold-trigger", "metadata": {"notes": notes}},
            ),
        )
        self.counters["threshold_triggers"] += 1
        self.fired[key] += 1
        await self._emit_request(req, {**state, f"threshold_job:{key}": req.training_job_id})

    async def lineage_routing(self) -> Any:
        """The deployment's lineages (`agentrl.release.lineage.Routing`); no registry or no
        lineage table: everything belongs to the default lineage."""
        now = time.monotonic()
        if self._routing is not None and now - self._routing_at < LINEAGE_TTL_S:
            return self._routing
        from agentrl.release.lineage import KEY, LineageTable, Routing

        table = LineageTable()
        try:
            kv = await self.bus.js.key_value(self.registry_bucket)
            entry = await kv.get(KEY)
            if entry.value:
                table = LineageTable.model_validate_json(entry.value)
        except Exception as exc:  # no registry yet, or no lineages: the default one only
            log.debug("no lineage table (%s): the default lineage only", type(exc).__name__)
        self._routing, self._routing_at = Routing(table, self.default_lineage), now
        return self._routing

    async def _lineage_override(self, key: str) -> dict[str, Any] | None:
        """A lineage job's request: its own agents' trajectories only (agents seen in more
        than one lineage are left out of every lineage's data), its lineage named in the
        metadata, continuing its own lineage's version when `init_from` is live / latest,
        and its trigger overrides (`Lineage.triggers["request"]`). None: not fired."""
        routing = await self.lineage_routing()
        lin = routing.served.get(key)
        if key != routing.default and lin is None:
            log.warning("threshold reached for lineage %s, which is retired or gone: dropped", key)
            return None
        if lin is not None and lin.state == "paused":
            log.info("threshold reached for lineage %s, which is paused: not fired", key)
            return None
        seen = dict(self.store.get_state("lineage_agents") or {})
        agents = sorted(
            {a for a, owner in seen.items() if owner == key}
            | {a for a in (lin.agents if lin else []) if seen.get(a, key) == key}
        )
        if not agents:
            log.warning("threshold reached for lineage %s with no agent of its own: dropped", key)
            return None
        tc: dict[str, Any] = {"dataset": {"filter": {"agent_ids": agents}}}
        mode = self.ts.init_from.partition(":")[0]
        if mode in ("live", "latest"):
            tc["init_from"] = f"{mode}:{key}"
        out: dict[str, Any] = {"training_config": tc, "metadata": {"lineage": key}}
        extra = (lin.triggers.get("request") if lin else None) or {}
        return merge(extra, out) if isinstance(extra, dict) else out

    def _scope_key(self, trajectory_id: str) -> str:
        if self.ts.threshold_scope == "global":
            return "*"
        key = self.store.get_state(f"scope:{trajectory_id}")
        if key is None:
            raise TransientError(f"trajectory {trajectory_id} not indexed yet")
        return str(key)

    async def _index_trajectories(self, stop: asyncio.Event) -> None:
        """For per-domain / per-agent thresholds: remember each trajectory's scope key."""

        async def index(batch: list[Delivery]) -> None:
            values: dict[str, Any] = {}
            by_lineage = self.ts.threshold_scope == "lineage"
            routing = await self.lineage_routing() if by_lineage else None
            seen = dict(self.store.get_state("lineage_agents") or {}) if by_lineage else {}
            for d in batch:
                with contextlib.suppress(Exception):
                    t = orjson.loads(d.data)
                    agent = str(t.get("agent_id", ""))
                    if routing is not None:
                        profile = t.get("subordinate_profile") or (t.get("metadata") or {}).get(
                            "agent_profile"
                        )
                        key = routing.of_agent(agent, profile)
                        # an agent whose trajectories belong to two lineages (one id, two
                        # profiles) is nobody's: an agent filter could not keep them apart
                        seen[agent] = key if seen.get(agent, key) == key else "*"
                    elif self.ts.threshold_scope == "domain":
                        key = (t.get("task_context") or {}).get("domain", "general")
                    else:
                        key = agent
                    values[f"scope:{t['trajectory_id']}"] = key
            if by_lineage:
                values["lineage_agents"] = seen
            self.store.set_state(values)

        await self.bus.consume(
            TRAJECTORY,
            f"{self.durable}-scope-{self.suffix}",
            batch_handler=index,
            stop=stop,
            validate=False,
            batch=1000,
        )

    async def _cron(self, stop: asyncio.Event) -> None:
        assert self.schedule is not None
        last = self.store.get_state("schedule_last")
        if last is None:  # first start ever: nothing was missed
            self.store.set_state({"schedule_last": self.clock().isoformat()})
        while not stop.is_set():
            await self.check_schedule()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cron_poll_s)

    async def check_schedule(self) -> bool:
        """Fire once when a schedule time passed since the last firing (missed ones too)."""
        assert self.schedule is not None
        if self.lease_kv is not None and not self.trigger_owner:
            return False  # another runner fires (the same id: one job if both did)
        last = datetime.fromisoformat(self.store.get_state("schedule_last"))
        due = self.schedule.due(last)
        if due is None:
            return False
        req = self.new_request(
            "scheduled",
            trigger_id("schedule", self.ts.schedule, due.isoformat()),
            {
                "requester": "agentrl-schedule-trigger",
                "metadata": {"notes": f"schedule {self.ts.schedule!r} at {due.isoformat()}"},
            },
        )
        self.counters["schedule_triggers"] += 1
        await self._emit_request(req, {"schedule_last": due.isoformat()})
        return True

    def _nats_url(self) -> str:
        servers = getattr(self.bus.nc, "connected_url", None)
        if servers is not None:
            return f"{servers.scheme}://{servers.hostname}:{servers.port}"
        return self.settings.nats_url or ""


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _kill(proc: asyncio.subprocess.Process | LaunchedJob) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def _lineage_of_request(request: dict[str, Any] | None) -> str | None:
    """The lineage a job's request names (`metadata.lineage`), or None."""
    meta = (request or {}).get("metadata") or {}
    name = meta.get("lineage") if isinstance(meta, dict) else None
    return str(name) if name else None


def _slug(name: str) -> str:
    """A name fit for consumer and lease keys."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "_"


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def _launcher_path() -> Path:
    """A socket path for a service's own launcher: short (a Unix socket's path has at most
    107 bytes; data dirs can be longer) and this service's alone."""
    return Path(tempfile.gettempdir()) / f"agentrl-launcher-{uuid.uuid4().hex[:12]}.sock"


def _kill_stale(pid: int) -> None:
    """Kill a job process left by a previous service (only if it is one of ours)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if b"agentrl.training.worker" in cmd:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _outbox_row(bus: Bus, event: TrainingStatus) -> tuple[str, str, bytes]:
    subject, data, msg_id = bus.encode(event)
    return msg_id, subject, data


def _lease_revision(data: bytes) -> int:
    """The fencing token a status was written under (0: none, an intake status)."""
    try:
        value = (orjson.loads(data).get("metadata") or {}).get("lease_revision")
        return int(value) if value is not None else 0
    except Exception:
        return 0


def _job_id_of(data: bytes) -> str | None:
    try:
        value = orjson.loads(data).get("training_job_id")
    except Exception:
        return None
    return str(value) if isinstance(value, str) and UUID_RE.match(value) else None


Serve = Callable[[Bus, asyncio.Event, Settings], Any]


async def serve(bus: Bus, stop: asyncio.Event, settings: Settings) -> None:
    """The training service inside `agentrl up`."""
    service = TrainingService(bus, settings)
    await service.run(stop)


__all__ = ["CANCEL_SUBJECT", "TrainingService", "new_id", "serve"]
