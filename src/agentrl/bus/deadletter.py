"""Dead-letter records for RL_DLQ: the failed message with why it failed.

A record carries the original bytes (base64) when they fit in one NATS message. Base64
adds a third, so a message above about 3/4 of `max_payload` cannot be copied: then the
record stores it by reference (`data_ref`: the original stream and sequence, where the
message still lies for the stream's retention) with a truncated excerpt. A dead letter can
therefore always be written, and a large poison message cannot stop a consumer.
"""

from __future__ import annotations

import base64
import json
from typing import Any

EXCERPT_BYTES = 2048
# Room left in max_payload for the headers and the publish protocol framing.
HEADROOM_BYTES = 4096


def build_record(
    *,
    subject: str,
    stream: str,
    stream_seq: int,
    consumer: str,
    delivery_count: int,
    kind: str,
    reason: str,
    at: str,
    headers: dict[str, str],
    data: bytes,
    max_bytes: int,
) -> bytes:
    """The JSON record for RL_DLQ, never longer than `max_bytes - HEADROOM_BYTES` unless the
    reason and headers alone are (they are truncated too)."""
    record: dict[str, Any] = {
        "original_subject": subject,
        "stream": stream,
        "stream_seq": stream_seq,
        "consumer": consumer,
        "delivery_count": delivery_count,
        "error_kind": kind,
        "error": reason[:8192],
        "dead_lettered_at": at,
        "headers": headers,
        "data_bytes": len(data),
        "data_b64": base64.b64encode(data).decode(),
    }
    budget = max(max_bytes - HEADROOM_BYTES, 1024) if max_bytes else 0
    encoded = json.dumps(record).encode()
    if not budget or len(encoded) <= budget:
        return encoded
    return by_reference(record, data, budget)


def by_reference(record: dict[str, Any], data: bytes, budget: int = 0) -> bytes:
    """The record without the payload: where the original lies, and its first bytes."""
    record = {k: v for k, v in record.items() if k != "data_b64"}
    record["data_ref"] = {"stream": record["stream"], "seq": record["stream_seq"]}
    record["data_excerpt"] = data[:EXCERPT_BYTES].decode("utf-8", errors="replace")
    record["data_truncated"] = True
    encoded = json.dumps(record).encode()
    if budget and len(encoded) > budget:  # enormous headers or reason: keep the essentials
        record["headers"] = {}
        record["error"] = str(record["error"])[:1024]
        encoded = json.dumps(record).encode()
    return encoded
