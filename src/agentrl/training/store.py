"""Durable state of the training service: jobs, trigger state and an outbox (one SQLite file).

Every transition is committed before it is announced, so a restart knows which jobs were
running (resume or fail them), which trigger counts were reached and which requests and
status events still have to be published: the outbox keeps them until their PubAck, and a
job's status change and its status event are one transaction, so a service that dies between
the commit and the publish publishes the event at its next start.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRIORITY_RANK = {"urgent": 0, "high": 1, "normal": 2, "low": 3}
ACTIVE = ("queued", "running")
FINAL = ("completed", "failed", "cancelled")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    kind TEXT NOT NULL,
    request TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    device TEXT,
    pid INTEGER,
    job_dir TEXT,
    resumes INTEGER NOT NULL DEFAULT 0,
    last_status TEXT
);
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs(status, priority, seq);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (msg_id TEXT PRIMARY KEY, subject TEXT NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS counted (
    trajectory_id TEXT NOT NULL, version INTEGER NOT NULL, PRIMARY KEY (trajectory_id, version)
) WITHOUT ROWID;
"""


@dataclass
class JobRow:
    job_id: str
    seq: int
    priority: int
    status: str
    kind: str
    request: dict[str, Any]
    created: float
    updated: float
    device: str | None
    pid: int | None
    job_dir: str | None
    resumes: int
    last_status: dict[str, Any] | None


class Store:
    """Thread-safe (one lock) SQLite store; every method is one transaction."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self.db.close()

    # -- jobs -------------------------------------------------------------------------------

    def add_job(
        self,
        job_id: str,
        priority: str,
        kind: str,
        request: dict[str, Any],
        outbox: list[tuple[str, str, bytes]] | None = None,
    ) -> bool:
        """Insert a queued job (and queue its outbox messages in the same transaction);
        False, and nothing queued, when the id is already known (a redelivered request)."""
        now = time.time()
        with self._lock:
            self.db.execute("BEGIN")
            try:
                seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
                cur = self.db.execute(
                    "INSERT OR IGNORE INTO jobs(job_id, seq, priority, status, kind, request,"
                    " created, updated) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?)",
                    (job_id, seq, PRIORITY_RANK.get(priority, 2), kind, json.dumps(request),
                     now, now),
                )  # fmt: skip
                added = cur.rowcount == 1
                if added:
                    self._queue(outbox)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return added

    def get(self, job_id: str) -> JobRow | None:
        with self._lock:
            row = self.db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return _row(row) if row else None

    def jobs(self, status: str | None = None) -> list[JobRow]:
        sql = "SELECT * FROM jobs"
        args: tuple[Any, ...] = ()
        if status:
            sql += " WHERE status = ?"
            args = (status,)
        with self._lock:
            rows = self.db.execute(sql + " ORDER BY seq", args).fetchall()
        return [_row(r) for r in rows]

    def next_queued(self) -> JobRow | None:
        """The job to run next: highest priority first, then first come first served."""
        with self._lock:
            row = self.db.execute(
                "SELECT * FROM jobs WHERE status = 'queued' ORDER BY priority, seq LIMIT 1"
            ).fetchone()
        return _row(row) if row else None

    def update(
        self, job_id: str, outbox: list[tuple[str, str, bytes]] | None = None, **fields: Any
    ) -> None:
        """Change a job's fields and queue outbox messages (its status event) atomically."""
        if "last_status" in fields and fields["last_status"] is not None:
            fields["last_status"] = json.dumps(fields["last_status"])
        fields["updated"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._lock:
            self.db.execute("BEGIN")
            try:
                self.db.execute(
                    f"UPDATE jobs SET {cols} WHERE job_id = ?", (*fields.values(), job_id)
                )
                self._queue(outbox)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def _queue(self, outbox: list[tuple[str, str, bytes]] | None) -> None:
        for msg_id, subject, data in outbox or []:
            self.db.execute(
                "INSERT OR IGNORE INTO outbox(msg_id, subject, data) VALUES (?, ?, ?)",
                (msg_id, subject, data),
            )

    # -- state and outbox ---------------------------------------------------------------------

    def get_state(self, key: str, default: Any = None) -> Any:
        with self._lock:
            row = self.db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def set_state(
        self,
        values: dict[str, Any],
        outbox: list[tuple[str, str, bytes]] | None = None,
        counted: Iterable[tuple[str, int]] = (),
    ) -> None:
        """Write state keys, queue outbox messages and record counted rewards in one
        transaction."""
        with self._lock:
            self.db.execute("BEGIN")
            try:
                self.db.executemany(
                    "INSERT OR IGNORE INTO counted(trajectory_id, version) VALUES (?, ?)",
                    list(counted),
                )
                for k, v in values.items():
                    self.db.execute(
                        "INSERT INTO state(key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                        (k, json.dumps(v)),
                    )
                self._queue(outbox)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def counted(self, pairs: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
        """Which of these (trajectory_id, reward version) pairs a threshold already counted."""
        wanted = list(set(pairs))
        found: set[tuple[str, int]] = set()
        with self._lock:
            for k in range(0, len(wanted), 400):
                chunk = wanted[k : k + 400]
                marks = ", ".join("(?, ?)" for _ in chunk)
                rows = self.db.execute(
                    f"SELECT trajectory_id, version FROM counted WHERE (trajectory_id, version)"
                    f" IN (VALUES {marks})",
                    [v for pair in chunk for v in pair],
                )
                found.update((str(t), int(v)) for t, v in rows)
        return found

    def outbox(self) -> list[tuple[str, str, bytes]]:
        """Unpublished messages, oldest first (a job's status events in their order)."""
        with self._lock:
            return list(self.db.execute("SELECT msg_id, subject, data FROM outbox ORDER BY rowid"))

    def outbox_size(self) -> int:
        with self._lock:
            return int(self.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def outbox_done(self, msg_id: str) -> None:
        with self._lock:
            self.db.execute("DELETE FROM outbox WHERE msg_id = ?", (msg_id,))


def _row(r: tuple[Any, ...]) -> JobRow:
    return JobRow(
        job_id=r[0],
        seq=r[1],
        priority=r[2],
        status=r[3],
        kind=r[4],
        request=json.loads(r[5]),
        created=r[6],
        updated=r[7],
        device=r[8],
        pid=r[9],
        job_dir=r[10],
        resumes=r[11],
        last_status=json.loads(r[12]) if r[12] else None,
    )
