"""NATS KV buckets of the training service (shared by the service, the API and the CLI).

`agentrl_training`: job id -> its latest `agent.rl.training.status.v1` payload (the service
writes, the API and CLI read). `agentrl_training_idem`: sha256 of an Idempotency-Key ->
{job_id, body_sha256} (the API's POST /training/start).
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.bus.kv import kv_keys

CANCEL_SUBJECT = "agent.rl.training.cancel.v1"
STATUS_BUCKET = "agentrl_training"
IDEM_BUCKET = "agentrl_training_idem"
RETENTION_S = 90 * 24 * 3600


async def bucket(js: Any, name: str, ttl: float = RETENTION_S) -> Any:
    """Open a KV bucket, creating it when missing."""
    from nats.js.api import KeyValueConfig

    from agentrl.bus.kv import open_bucket

    return await open_bucket(js, KeyValueConfig(bucket=name, history=1, ttl=ttl))


async def read_status(js: Any, job_id: str) -> dict[str, Any] | None:
    from nats.js.errors import KeyNotFoundError

    kv = await bucket(js, STATUS_BUCKET)
    try:
        entry = await kv.get(job_id)
    except (KeyNotFoundError, Exception):
        return None
    if not entry.value:
        return None
    data: dict[str, Any] = json.loads(entry.value)
    return data


async def all_statuses(js: Any) -> list[dict[str, Any]]:
    """Every job's latest status, oldest first."""
    from nats.js.errors import NoKeysError

    kv = await bucket(js, STATUS_BUCKET)
    try:
        keys = await kv_keys(kv)
    except NoKeysError:
        return []
    out = []
    for k in keys:
        s = await read_status(js, k)
        if s is not None:
            out.append(s)
    out.sort(key=lambda s: str(s.get("timestamp", "")))
    return out
