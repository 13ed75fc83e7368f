"""Which trajectories an episode id or a completion id belongs to (a NATS KV bucket).

Feedback often names what the caller knows (its session, the `id` of a chat completion)
rather than the trajectory id agentrl minted. The gateway's capture writes a completion's
key as soon as it served it (the trajectory id of an episode is fixed by its first
completion), so feedback and OTLP traces can name it before the episode ends; an episode
id keeps the list of every trajectory published under it (a key reused after an idle
timeout, an episode closed for memory and continued). KV, not memory: the gateway and the
control API may be different processes, and a restart must not forget.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

EPISODE = "ep"
COMPLETION = "cid"
CALL = "call"  # a tool call id the gateway minted -> the completion that minted it
MAX_PER_EPISODE = 1000  # trajectory ids kept per episode id (the newest)


def key(kind: str, value: str) -> str:
    """A KV-safe key for any id (KV keys allow only [-/_=.a-zA-Z0-9])."""
    return f"{kind}.{hashlib.sha256(value.encode()).hexdigest()[:40]}"


def _ids(raw: bytes | None) -> list[str]:
    """An episode's value: a JSON list (a bare trajectory id from older versions)."""
    if not raw:
        return []
    text = raw.decode()
    if text.startswith("["):
        try:
            return [str(x) for x in json.loads(text)]
        except ValueError:
            return []
    return [text]


class TrajectoryIndex:
    def __init__(self, kv: Any) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: Any, bucket: str, ttl_s: float) -> TrajectoryIndex:
        from nats.js.api import KeyValueConfig

        from agentrl.bus.kv import open_bucket

        return cls(await open_bucket(js, KeyValueConfig(bucket=bucket, history=1, ttl=ttl_s)))

    async def put_completions(self, pairs: list[tuple[str, str]]) -> None:
        """completion id -> trajectory id, for many at once."""
        await self.put_pairs(COMPLETION, pairs)

    async def put_pairs(self, kind: str, pairs: list[tuple[str, str]]) -> None:
        """`kind` id -> value, for many at once."""
        await asyncio.gather(*(self.kv.put(key(kind, k), v.encode()) for k, v in pairs if k))

    async def add_episode(self, episode_id: str, trajectory_id: str) -> None:
        """Append `trajectory_id` to the episode's list (compare-and-set: several gateways
        may publish under one key)."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        k = key(EPISODE, episode_id)
        for _ in range(8):
            try:
                entry = await self.kv.get(k)
                ids, rev = _ids(entry.value), entry.revision
            except KeyNotFoundError:
                ids, rev = [], 0
            if trajectory_id in ids:
                return
            value = json.dumps([*ids, trajectory_id][-MAX_PER_EPISODE:]).encode()
            try:
                if rev:
                    await self.kv.update(k, value, last=rev)
                else:
                    await self.kv.create(k, value)
                return
            except KeyWrongLastSequenceError:  # a concurrent writer: read again
                continue
        raise RuntimeError(f"index of episode {episode_id!r}: too many concurrent writers")

    async def put(
        self, trajectory_id: str, episode_id: str | None, completion_ids: list[str]
    ) -> None:
        await self.put_completions([(c, trajectory_id) for c in completion_ids])
        if episode_id:
            await self.add_episode(episode_id, trajectory_id)

    async def get(self, kind: str, value: str) -> str | None:
        """The trajectory of a completion, or the newest of an episode."""
        found = await self.all(kind, value)
        return found[-1] if found else None

    async def all(self, kind: str, value: str) -> list[str]:
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self.kv.get(key(kind, value))
        except KeyNotFoundError:
            return []
        return _ids(entry.value)
