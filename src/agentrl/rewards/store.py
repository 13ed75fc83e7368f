"""The reward service's durable state: one SQLite file in the data dir.

Why one transaction per batch: the window statistics, the record that a trajectory was scored
(with its reward, for redelivery and late feedback) and the applied feedback ids must move
together. If the process dies after the commit but before the trajectories were acked, the
redelivered trajectories are found here and acked without scoring them again, so the windows
never count a trajectory twice.

The same transaction puts each new reward into an outbox; the service publishes it in the
background and deletes it when JetStream confirms (PubAck). The outbox is the only way a reward
is ever published: a row in it means "not yet confirmed", a reward without a row was confirmed.
So a redelivered trajectory whose reward is confirmed is acked without republishing, at any
delay (JetStream's duplicate window, 120 s, is only the second line of defence), and whatever a
crash leaves in the outbox is published again at start, under the same reward id, after
checking the reward stream for the ones that did get through.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from agentrl.rewards.window import WindowState

SCHEMA = """
CREATE TABLE IF NOT EXISTS rewards (
    trajectory_id TEXT PRIMARY KEY,
    version       INTEGER NOT NULL,
    reward        BLOB NOT NULL,      -- the latest RewardEvent as JSON
    feedback      TEXT NOT NULL,      -- FeedbackState as JSON
    scored_at     REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rewards_scored_at ON rewards (scored_at);
CREATE TABLE IF NOT EXISTS feedback (
    feedback_id   TEXT PRIMARY KEY,
    trajectory_id TEXT NOT NULL,
    payload       TEXT NOT NULL,      -- the FeedbackEvent as JSON
    version       INTEGER,            -- reward version it produced; NULL while pending
    received_at   REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS feedback_pending ON feedback (trajectory_id) WHERE version IS NULL;
CREATE TABLE IF NOT EXISTS dropped (
    trajectory_id TEXT PRIMARY KEY,
    reason        TEXT NOT NULL,
    dropped_at    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (     -- rewards committed but not yet confirmed by JetStream
    reward_id     TEXT PRIMARY KEY,
    trajectory_id TEXT NOT NULL,
    created_at    REAL NOT NULL,
    reward        BLOB                -- this version's RewardEvent (NULL: rows of older files)
);
"""


@dataclass
class StoredReward:
    trajectory_id: str
    version: int
    reward_json: bytes
    feedback: dict[str, Any]


class RewardStore:
    """SQLite (WAL, synchronous=FULL) state of one reward service."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(outbox)")}
        if "reward" not in columns:  # a state file of an older version
            self.db.execute("ALTER TABLE outbox ADD COLUMN reward BLOB")

    def close(self) -> None:
        self.db.close()

    # ---- reads ------------------------------------------------------------------------
    def load_windows(self, size: int, efficiency_size: int) -> WindowState:
        row = self.db.execute("SELECT value FROM kv WHERE key='windows'").fetchone()
        if row is None:
            return WindowState(size, efficiency_size)
        return WindowState.from_bytes(bytes(row[0]), size, efficiency_size)

    def load_counters(self) -> dict[str, int]:
        row = self.db.execute("SELECT value FROM kv WHERE key='counters'").fetchone()
        return dict(json.loads(row[0])) if row else {}

    def rewards(self, trajectory_ids: Sequence[str]) -> dict[str, StoredReward]:
        out: dict[str, StoredReward] = {}
        for chunk in _chunks(list(trajectory_ids), 500):
            q = f"SELECT trajectory_id, version, reward, feedback FROM rewards WHERE trajectory_id IN ({','.join('?' * len(chunk))})"
            for tid, version, reward, fb in self.db.execute(q, chunk):
                out[tid] = StoredReward(tid, int(version), bytes(reward), json.loads(fb))
        return out

    def dropped(self, trajectory_ids: Sequence[str]) -> set[str]:
        out: set[str] = set()
        for chunk in _chunks(list(trajectory_ids), 500):
            q = f"SELECT trajectory_id FROM dropped WHERE trajectory_id IN ({','.join('?' * len(chunk))})"
            out.update(r[0] for r in self.db.execute(q, chunk))
        return out

    def pending_feedback(self, trajectory_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Feedback that arrived before its trajectory, oldest first."""
        out: dict[str, list[dict[str, Any]]] = {}
        for chunk in _chunks(list(trajectory_ids), 500):
            q = (
                "SELECT trajectory_id, payload FROM feedback WHERE version IS NULL AND "
                f"trajectory_id IN ({','.join('?' * len(chunk))}) ORDER BY received_at, rowid"
            )
            for tid, payload in self.db.execute(q, chunk):
                out.setdefault(tid, []).append(json.loads(payload))
        return out

    def feedback_seen(self, feedback_ids: Sequence[str]) -> dict[str, tuple[str, int | None]]:
        """feedback_id -> (trajectory_id, version it produced or None while pending)."""
        out: dict[str, tuple[str, int | None]] = {}
        for chunk in _chunks(list(feedback_ids), 500):
            q = f"SELECT feedback_id, trajectory_id, version FROM feedback WHERE feedback_id IN ({','.join('?' * len(chunk))})"
            for fid, tid, version in self.db.execute(q, chunk):
                out[fid] = (tid, version)
        return out

    def has_rows(self, table: str, where: str = "1") -> bool:
        if table not in ("rewards", "feedback", "dropped", "outbox"):
            raise ValueError(f"unknown table {table!r}")
        return (
            self.db.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {where})").fetchone()[0]
            == 1
        )

    def count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM rewards").fetchone()[0])

    # ---- the one write per batch ------------------------------------------------------
    def commit(
        self,
        *,
        rewards: Iterable[tuple[str, int, bytes, dict[str, Any]]] = (),
        windows: WindowState | None = None,
        feedback_new: Iterable[tuple[str, str, str, int | None]] = (),
        feedback_applied: Iterable[tuple[str, int]] = (),
        dropped: Iterable[tuple[str, str]] = (),
        counters: dict[str, int] | None = None,
        outbox: Iterable[tuple[str, str, bytes]] = (),
    ) -> None:
        """Write everything of one batch atomically (and durably) or nothing.

        rewards: (trajectory_id, version, reward_json, feedback_state); feedback_new:
        (feedback_id, trajectory_id, payload_json, version or None); feedback_applied:
        (feedback_id, version) for pending feedback now folded into a reward.
        """
        now = time.time()
        cur = self.db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.executemany(
                "INSERT OR REPLACE INTO rewards VALUES (?, ?, ?, ?, ?)",
                [(tid, v, r, orjson.dumps(fb).decode(), now) for tid, v, r, fb in rewards],
            )
            cur.executemany(
                "INSERT OR IGNORE INTO feedback VALUES (?, ?, ?, ?, ?)",
                [(fid, tid, payload, v, now) for fid, tid, payload, v in feedback_new],
            )
            cur.executemany(
                "UPDATE feedback SET version=? WHERE feedback_id=?",
                [(v, fid) for fid, v in feedback_applied],
            )
            cur.executemany(
                "INSERT OR IGNORE INTO dropped VALUES (?, ?, ?)",
                [(tid, why, now) for tid, why in dropped],
            )
            cur.executemany(
                "INSERT OR REPLACE INTO outbox (reward_id, trajectory_id, created_at, reward) "
                "VALUES (?, ?, ?, ?)",
                [(rid, tid, now, reward) for rid, tid, reward in outbox],
            )
            if windows is not None:
                cur.execute(
                    "INSERT OR REPLACE INTO kv VALUES ('windows', ?)", (windows.to_bytes(),)
                )
            if counters is not None:
                cur.execute(
                    "INSERT OR REPLACE INTO kv VALUES ('counters', ?)", (json.dumps(counters),)
                )
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

    def outbox(self, older_than_s: float = 0.0, limit: int = 10_000) -> list[tuple[str, bytes]]:
        """(outbox reward id, that reward version's JSON) for rewards not yet confirmed
        published, oldest first. Each version is its own row: a version 1 that a crash left
        unpublished is published even when feedback's version 2 came after it (the soak
        found such gaps when the rows pointed at the trajectory's latest reward). Rows of an
        older state file, without their own payload, are answered with the latest one."""
        return [(rid, data) for rid, data, _ in self.outbox_rows(older_than_s, limit)]

    def outbox_rows(
        self, older_than_s: float = 0.0, limit: int = 10_000
    ) -> list[tuple[str, bytes, float]]:
        """Like `outbox()`, with each row's creation time (unix seconds)."""
        cutoff = time.time() - older_than_s
        rows = self.db.execute(
            "SELECT o.reward_id, COALESCE(o.reward, r.reward), o.created_at FROM outbox o "
            "JOIN rewards r USING (trajectory_id) "
            "WHERE o.created_at <= ? ORDER BY o.created_at LIMIT ?",
            (cutoff, limit),
        ).fetchall()
        return [(str(rid), bytes(data), float(at)) for rid, data, at in rows]

    def confirm(self, reward_ids: Sequence[str]) -> None:
        """JetStream stored these rewards: take them out of the outbox.

        Without an fsync of its own (synchronous=NORMAL for this transaction): a confirm lost
        to a power failure only means the next start reads the reward stream back and finds
        the rewards there, so it costs no duplicate, and the service saves a disk flush per
        batch. The next batch commit (synchronous=FULL) flushes it anyway."""
        cur = self.db.cursor()
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.executemany("DELETE FROM outbox WHERE reward_id=?", [(r,) for r in reward_ids])
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        finally:
            cur.execute("PRAGMA synchronous=FULL")

    def unconfirmed(self, trajectory_ids: Sequence[str]) -> set[str]:
        """The trajectories among these whose latest reward is still in the outbox."""
        out: set[str] = set()
        for chunk in _chunks(list(trajectory_ids), 500):
            q = f"SELECT trajectory_id FROM outbox WHERE trajectory_id IN ({','.join('?' * len(chunk))})"
            out.update(r[0] for r in self.db.execute(q, chunk))
        return out

    def prune(self, retention_s: float) -> int:
        """Forget rewards, feedback and drop records older than the retention.

        A reward still in the outbox (never confirmed published) is kept whatever its age:
        pruning it would orphan its outbox row and lose the reward."""
        cutoff = time.time() - retention_s
        cur = self.db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            n = cur.execute(
                "DELETE FROM rewards WHERE scored_at < ? AND trajectory_id NOT IN "
                "(SELECT trajectory_id FROM outbox)",
                (cutoff,),
            ).rowcount
            cur.execute(
                "DELETE FROM feedback WHERE received_at < ? AND trajectory_id NOT IN "
                "(SELECT trajectory_id FROM outbox)",
                (cutoff,),
            )
            cur.execute("DELETE FROM dropped WHERE dropped_at < ?", (cutoff,))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return int(n)


def _chunks(items: list[str], n: int) -> Iterable[list[str]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
