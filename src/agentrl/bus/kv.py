"""Listing a KV bucket's keys without leaking consumers.

nats-py's `KeyValue.keys()` watches the bucket through an ordered consumer that the server
keeps for five minutes after the call (its fixed `inactive_threshold`): a deployment
controller that lists its registry twice a second reached the server's consumer limit
within minutes (`maximum consumers limit reached`). Same listing, a consumer that goes
two seconds after the call.
"""

from __future__ import annotations

from typing import Any

INACTIVE_S = 2.0


async def kv_keys(kv: Any) -> list[str]:
    """The bucket's live keys (deleted and purged ones left out); [] for an empty bucket."""
    watcher = await kv.watchall(ignore_deletes=True, meta_only=True, inactive_threshold=INACTIVE_S)
    keys: list[str] = []
    try:
        async for entry in watcher:
            if entry is None:  # the watcher's end-of-initial-values marker
                break
            keys.append(entry.key)
    finally:
        await watcher.stop()
    return keys
