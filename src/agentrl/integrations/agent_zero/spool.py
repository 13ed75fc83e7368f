"""The on-disk spool: events wait here until NATS takes them, in order, exactly once.

Every event is written to the spool first (one file per event, written to a temporary name
and renamed, so a crash leaves whole files only), then the spool is flushed oldest first:
each file is published with its event id as `Nats-Msg-Id` and deleted after the PubAck. A
flush stops at the first failure, so a later event never overtakes an earlier one; JetStream's
duplicate window (and consumers keyed by event id) drop a message published twice when a
crash came between the PubAck and the delete. An event NATS can never take (over its
max_payload, refused as a bad request) is moved aside as `.bad` with a `.why` note, counted
and logged, and the flush goes on: one such file never blocks the spool. One flusher at a time (an flock on
`.lock`): Agent Zero's superior and subordinates, or two processes, may end monologues at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agentrl.contracts.base import Event

_counter = itertools.count()


@dataclass(frozen=True)
class Spooled:
    path: Path
    subject: str
    msg_id: str
    data: bytes


class Spool:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def put(self, event: Event) -> Path:
        """Write one event (its wire bytes); returns its file. Names sort in write order."""
        return self.put_raw(event.SUBJECT, event.msg_id(), event.to_json())

    def put_raw(self, subject: str, msg_id: str, data: bytes) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid():07d}-{next(_counter):08d}"
        header = json.dumps({"subject": subject, "msg_id": msg_id}).encode()
        tmp = self.folder / f".{name}.tmp"
        with tmp.open("wb") as fh:
            fh.write(header + b"\n" + data)
            fh.flush()
            os.fsync(fh.fileno())
        final = self.folder / f"{name}.event"
        os.replace(tmp, final)
        return final

    def pending(self) -> list[Spooled]:
        """Spooled events, oldest first; an unreadable file is moved aside (`.bad`)."""
        if not self.folder.is_dir():
            return []
        out = []
        for path in sorted(self.folder.glob("*.event")):
            try:
                raw = path.read_bytes()
                head, _, data = raw.partition(b"\n")
                meta = json.loads(head)
                out.append(Spooled(path, str(meta["subject"]), str(meta["msg_id"]), data))
            except FileNotFoundError:  # flushed by another process meanwhile
                continue
            except (ValueError, KeyError, OSError):
                with contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".bad"))
        return out

    def set_aside(self, item: Spooled, reason: str) -> Path:
        """Move an event NATS refuses for good out of the queue (`.bad`, reason in `.why`)."""
        bad = item.path.with_suffix(".bad")
        with contextlib.suppress(OSError):
            bad.with_suffix(".why").write_text(reason + "\n")
        os.replace(item.path, bad)
        return bad

    def bad_count(self) -> int:
        """How many events were set aside (unreadable, or refused for good)."""
        return len(list(self.folder.glob("*.bad"))) if self.folder.is_dir() else 0

    def __len__(self) -> int:
        return len(list(self.folder.glob("*.event"))) if self.folder.is_dir() else 0

    @contextlib.contextmanager
    def locked(self) -> Iterator[bool]:
        """Hold the flush lock if it is free (yields False when another flusher has it)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / ".lock").open("a") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
