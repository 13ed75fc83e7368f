"""The job queue every training runner shares (NATS KV), and the leases that own its jobs.

`agentrl_training_queue`: job id -> {request, kind, priority, created, resumes, cancel}, present
while the job is queued or running (the runner that publishes its final status deletes it).
A runner takes a job by taking the lease `job.<id>` (see `agentrl.bus.lease`) and keeps it
while the job runs; a runner that dies stops renewing, the lease expires, and another runner
takes the job and resumes it from the newest checkpoint in the shared storage path.

Intake is create-only on the queue key, after a look at the status bucket (a finished job's
queue key is gone, its status is not): a request redelivered to another runner, or
re-published by a second trigger replica with the same deterministic id, is one job.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.bus.kv import kv_keys
from agentrl.training.kv import RETENTION_S, bucket

QUEUE_BUCKET = "agentrl_training_queue"
FINAL = ("completed", "failed", "cancelled")


@dataclass
class QueueEntry:
    job_id: str
    request: dict[str, Any]
    kind: str
    priority: int
    created: float = field(default_factory=time.time)
    resumes: int = 0
    cancel: bool = False
    revision: int = 0

    def to_bytes(self) -> bytes:
        data = {k: v for k, v in self.__dict__.items() if k not in ("revision", "job_id")}
        return json.dumps(data).encode()

    @classmethod
    def parse(cls, job_id: str, value: bytes, revision: int) -> QueueEntry:
        data = json.loads(value)
        return cls(
            job_id=job_id,
            request=data["request"],
            kind=str(data.get("kind", "dataset")),
            priority=int(data.get("priority", 2)),
            created=float(data.get("created", 0.0)),
            resumes=int(data.get("resumes", 0)),
            cancel=bool(data.get("cancel", False)),
            revision=revision,
        )

    def order(self) -> tuple[int, float, str]:
        return (self.priority, self.created, self.job_id)


class JobQueue:
    """The shared queue bucket."""

    def __init__(self, kv: Any) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: Any) -> JobQueue:
        return cls(await bucket(js, QUEUE_BUCKET, RETENTION_S))

    async def add(self, entry: QueueEntry) -> bool:
        """Create-only: False when the job is already queued or running."""
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            entry.revision = await self.kv.create(entry.job_id, entry.to_bytes())
        except KeyWrongLastSequenceError:
            return False
        return True

    async def get(self, job_id: str) -> QueueEntry | None:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        try:
            e = await self.kv.get(job_id)
        except (KeyNotFoundError, KeyDeletedError):
            return None
        if not e.value:
            return None
        return QueueEntry.parse(job_id, e.value, e.revision)

    async def update(self, entry: QueueEntry) -> bool:
        """Compare-and-set on the entry's revision; False when it changed meanwhile."""
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            entry.revision = await self.kv.update(
                entry.job_id, entry.to_bytes(), last=entry.revision
            )
        except KeyWrongLastSequenceError:
            return False
        return True

    async def remove(self, job_id: str) -> None:
        await self.kv.delete(job_id)

    async def entries(self) -> list[QueueEntry]:
        """Every queued or running job, in scheduling order (priority, then arrival)."""
        out = []
        for key in await kv_keys(self.kv):
            entry = await self.get(key)
            if entry is not None:
                out.append(entry)
        return sorted(out, key=QueueEntry.order)


async def status_of(kv: Any, job_id: str) -> dict[str, Any] | None:
    """A job's latest status from the status bucket (None: never announced)."""
    from nats.js.errors import KeyDeletedError, KeyNotFoundError

    try:
        e = await kv.get(job_id)
    except (KeyNotFoundError, KeyDeletedError):
        return None
    if not e.value:
        return None
    data: dict[str, Any] = json.loads(e.value)
    return data
