"""Which trajectory an episode id or a completion id belongs to (a NATS KV bucket).

Feedback often names what the caller knows (its session, the `id` of a chat completion)
rather than the trajectory id agentrl minted; the capture paths write these keys when they
publish, the feedback route reads them. KV, not memory: the gateway and the control API may
be different processes, and a restart must not forget.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

EPISODE = "ep"
COMPLETION = "cid"


def key(kind: str, value: str) -> str:
    """A KV-safe key for any id (KV keys allow only [-/_=.a-zA-Z0-9])."""
    return f"{kind}.{hashlib.sha256(value.encode()).hexdigest()[:40]}"


class TrajectoryIndex:
    def __init__(self, kv: Any) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: Any, bucket: str, ttl_s: float) -> TrajectoryIndex:
        from nats.js.api import KeyValueConfig

        try:
            kv = await js.key_value(bucket)
        except Exception:
            kv = await js.create_key_value(KeyValueConfig(bucket=bucket, history=1, ttl=ttl_s))
        return cls(kv)

    async def put(
        self, trajectory_id: str, episode_id: str | None, completion_ids: list[str]
    ) -> None:
        value = trajectory_id.encode()
        keys = [key(COMPLETION, c) for c in completion_ids if c]
        if episode_id:
            keys.append(key(EPISODE, episode_id))
        await asyncio.gather(*(self.kv.put(k, value) for k in keys))

    async def get(self, kind: str, value: str) -> str | None:
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await self.kv.get(key(kind, value))
        except KeyNotFoundError:
            return None
        return entry.value.decode() if entry.value else None
