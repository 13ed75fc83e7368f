"""Shared reward records in NATS KV: one reward per (trajectory, version) across replicas.

Why: N reward services share one durable consumer. A trajectory redelivered to another
replica (its first holder was killed, or stalled past ack_wait) must not become a second
reward, and the record of what was committed cannot live in one replica's SQLite file.

One key per trajectory in the bucket `rl_rewards_<durable>` (the replicas of one service
share its durable name, so they share the bucket). Its value (JSON) is one of:
- `{"version": n, "reward": {...}, "feedback": {...}, "by": replica, "at": unix}`: reward
  version n is committed (and published, or about to be, under Nats-Msg-Id = its reward_id);
- `{"version": 0, "pending": [feedback payloads]}`: feedback that came before its trajectory;
- `{"version": 0, "dropped": reason}`: an opted-out trajectory (its feedback is dropped too).

Every transition is create-only (`kv.create` fails when the key exists) or compare-and-set
on the revision, so exactly one replica commits each version. A replica killed between the
commit and the publish leaves a record whose reward is not in the stream: whoever gets the
redelivered message publishes the record's reward under the same id (after reading the
reward stream back, so it is stored once even after JetStream's duplicate window).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import socket
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
import orjson

from agentrl.bus import wire
from agentrl.bus.kv import open_bucket

_NEW = {"Nats-Expected-Last-Subject-Sequence": "0"}  # create-only: the key has no message
_WRONG_LAST_SEQ = 10071  # JetStream's error code when it has one
_NEW_HDR = b"NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: 0\r\n\r\n"
_NO_ANSWER = b'{"error": {"description": "no JetStream answer"}}'
_SAFE = re.compile(r"[A-Za-z0-9_-]{1,200}")
_BUCKET_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def _first_answer(futures: list[asyncio.Future[bytes]]) -> bytes | None:
    """An item's answer over its rounds: a success if any (a later round of a stored create
    answers 'wrong last sequence'), else an error; None while none came (a 503 is none)."""
    got = [f.result() for f in futures if f.done() and f.result() != _NO_ANSWER]
    ok = [a for a in got if b'"error"' not in a]
    return ok[0] if ok else (got[0] if got else None)


def _hpub_new(subject: bytes, reply: bytes, data: bytes) -> bytes:
    """One HPUB frame of a create-only write (the key must have no message yet)."""
    n = len(_NEW_HDR)
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject, reply, n, n + len(data), _NEW_HDR, data)


def replica_name() -> str:
    """This process's name among replicas (recorded in the records it commits):
    $AGENTRL_REPLICA_ID (as `agentrl up --replicas` sets it) or $AGENTRL_REPLICA, else
    host-pid. Correctness never depends on it: it only tells whose record a replica found."""
    name = os.environ.get("AGENTRL_REPLICA_ID") or os.environ.get("AGENTRL_REPLICA")
    return name or f"{socket.gethostname()}-{os.getpid()}"


def key_for(trajectory_id: str) -> str:
    """A KV key for a trajectory id (ids outside the key alphabet are hashed)."""
    if _SAFE.fullmatch(trajectory_id):
        return trajectory_id
    return "sha256_" + hashlib.sha256(trajectory_id.encode()).hexdigest()


def bucket_name(durable: str) -> str:
    return "rl_rewards_" + _BUCKET_UNSAFE.sub("_", durable)


@dataclass
class Record:
    """A trajectory's shared record and its KV revision (for compare-and-set)."""

    data: dict[str, Any]
    revision: int

    @property
    def version(self) -> int:
        return int(self.data.get("version", 0))

    @property
    def scored(self) -> bool:
        return self.version >= 1

    @property
    def dropped(self) -> str | None:
        why = self.data.get("dropped")
        return str(why) if why is not None else None

    @property
    def pending(self) -> list[dict[str, Any]]:
        return list(self.data.get("pending", []))


class Claims:
    """The bucket of shared reward records (see the module docstring)."""

    def __init__(self, nc: Any, kv: Any, name: str, replica: str) -> None:
        self.nc = nc
        self.kv = kv
        self.subject_prefix = f"$KV.{name}."
        self.replica = replica
        self.timeout = 10.0  # seconds for a batch of creates (no answer: the batch fails)
        self.stall_s = 1.0  # silence after which unanswered creates are written again
        self._inbox = ""
        self._sub: Any = None
        self._serial = 0
        self._waiting: dict[str, asyncio.Future[bytes]] = {}

    @classmethod
    async def open(
        cls,
        nc: Any,
        js: Any,
        durable: str,
        *,
        replicas: int = 1,
        ttl_s: float = 0.0,
        replica: str | None = None,
        open_deadline_s: float = 60.0,
    ) -> Claims:
        from nats.js.api import KeyValueConfig

        name = bucket_name(durable)
        config = KeyValueConfig(bucket=name, history=1, ttl=ttl_s or None, replicas=replicas)
        kv = await open_bucket(js, config, deadline_s=open_deadline_s)
        return cls(nc, kv, name, replica or replica_name())

    def scored(
        self, reward_json: bytes, feedback: dict[str, Any], version: int, at: float
    ) -> bytes:
        """The value of a committed reward version (`reward_json`: the reward as published)."""
        rest = orjson.dumps({"feedback": feedback, "by": self.replica, "at": at})
        return b'{"version":%d,"reward":%s,%s' % (version, reward_json, rest[1:])

    async def get(self, trajectory_id: str) -> Record | None:
        try:
            entry = await self.kv.get(key_for(trajectory_id))
        except nats.js.errors.KeyNotFoundError:
            return None
        if not entry.value:
            return None
        return Record(orjson.loads(entry.value), int(entry.revision or 0))

    async def create(self, trajectory_id: str, value: bytes) -> Record | None:
        """Create the record; None when this call created it, else the record that exists."""
        try:
            await self.kv.create(key_for(trajectory_id), value)
            return None
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        for _ in range(20):  # it exists; read it (a purge in between would read as missing)
            found = await self.get(trajectory_id)
            if found is not None:
                return found
            try:
                await self.kv.create(key_for(trajectory_id), value)
                return None
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
        raise RuntimeError(f"cannot create or read the reward record of {trajectory_id}")

    async def create_many(self, items: list[tuple[str, bytes]]) -> list[Record | None]:
        """`create` for a batch: the creates are pipelined (written at once, one answer
        each on this object's inbox: a quarter of the client CPU of concurrent `kv.create`
        calls, and nats-py's `publish_async` loses error answers); the keys that exist are
        read back one by one (the rare case).

        Creates still unanswered after `stall_s` without a single answer (lost with a
        killed stream leader, or a 503 while one is elected) are written again until
        `timeout`: a batch caught by a SIGKILLed leader waited out the whole 10 s, and its
        trajectories a nak after that. Writing a create again is safe: one that was stored
        answers 'wrong last sequence' the second time, and is read back like any existing
        record (its `by` says it was ours)."""
        fast = wire.supported(self.nc)
        if self._sub is None:
            self._inbox = self.nc.new_inbox()
            if fast:  # answers go straight to `_take`, no Msg object per answer
                self._sub = await wire.subscribe(self.nc, self._inbox + ".*", sink=self._take)
            else:
                self._sub = await self.nc.subscribe(self._inbox + ".*", cb=self._answer)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        sent: list[list[str]] = [[] for _ in items]  # each item's tokens, round by round
        answers: list[bytes | None] = [None] * len(items)
        todo = list(range(len(items)))
        try:
            while True:
                tokens = await self._send_creates(items, todo, fast, sent)
                await self._until_stalled(tokens, deadline)
                for i in todo:  # an earlier round's late answer counts too
                    answers[i] = _first_answer([self._waiting[t] for t in sent[i]])
                todo = [i for i in todo if answers[i] is None]
                if not todo:
                    break
                if loop.time() >= deadline:
                    raise TimeoutError(f"{len(todo)} reward record creates got no answer")
                await asyncio.sleep(min(0.2, max(deadline - loop.time(), 0.0)))
        finally:
            for tokens in sent:
                for token in tokens:
                    self._waiting.pop(token, None)
        out: list[Record | None] = []
        for (tid, value), answer in zip(items, answers, strict=True):
            assert answer is not None
            error = orjson.loads(answer).get("error")
            if error is None:
                out.append(None)
            elif error.get("err_code") == _WRONG_LAST_SEQ:
                out.append(await self.create(tid, value))  # exists: read it (or a purge raced)
            else:
                raise RuntimeError(f"creating the reward record of {tid} failed: {error}")
        return out

    async def _send_creates(
        self, items: list[tuple[str, bytes]], which: list[int], fast: bool, sent: list[list[str]]
    ) -> list[str]:
        """Write the create-only puts of `items[i]` for i in `which`; their reply tokens (also
        added to `sent[i]`, before anything is written)."""
        loop = asyncio.get_running_loop()
        tokens: list[str] = []
        frames: list[bytes] = []
        reply = self._inbox.encode() + b"."
        for i in which:
            tid, value = items[i]
            self._serial += 1
            token = f"{self._serial:x}"
            tokens.append(token)
            sent[i].append(token)
            self._waiting[token] = loop.create_future()
            subject = self.subject_prefix + key_for(tid)
            if fast:
                frames.append(_hpub_new(subject.encode(), reply + token.encode(), value))
            else:
                await self.nc.publish(subject, value, reply=f"{self._inbox}.{token}", headers=_NEW)
        await wire.write(self.nc, frames)
        return tokens

    async def _until_stalled(self, tokens: list[str], deadline: float) -> None:
        """Until every token is answered, `stall_s` pass without a new answer, or the
        deadline."""
        loop = asyncio.get_running_loop()
        pending = {self._waiting[t] for t in tokens}
        while pending:
            left = deadline - loop.time()
            if left <= 0:
                return
            done, pending = await asyncio.wait(pending, timeout=min(self.stall_s, left))
            if not done:
                return

    def _take(self, subject: bytes, data: bytes, _headers: bytes | None) -> None:
        fut = self._waiting.get(subject.rsplit(b".", 1)[-1].decode())
        if fut is not None and not fut.done():
            # an empty answer is a status (e.g. 503: no JetStream answered): not a create
            fut.set_result(data or _NO_ANSWER)

    async def _answer(self, msg: Any) -> None:
        self._take(msg.subject.encode(), msg.data, None)

    async def update(self, trajectory_id: str, value: bytes, revision: int) -> int | None:
        """Compare-and-set: the new revision, or None when someone else changed the record
        since `revision`."""
        try:
            return int(await self.kv.update(key_for(trajectory_id), value, last=revision))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None
