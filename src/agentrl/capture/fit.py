"""A trajectory over the server's max_payload, made to fit (pure).

The contract's rule for size (the Agent Zero recorder's too): long texts are cut, head and
tail kept, the cut said in the text; turns are never dropped or reordered. Budgets shrink
until the event fits; `metadata.capture.trimmed` says how far it went and the original
size. None when even the smallest budget does not fit (too many turns: dead-letter it).
"""

from __future__ import annotations

import json
from typing import Any

from agentrl.contracts.trajectory import TrajectoryEvent

BUDGETS = (32_768, 8_192, 2_048, 512, 128)
HEADROOM = 4096  # headers and framing


def cut(text: str, budget: int) -> str:
    """`text` cut to about `budget` UTF-8 bytes, head and tail kept, the cut said in it."""
    data = text.encode("utf-8", "replace")
    if len(data) <= budget:
        return text
    keep = max(0, budget - 48) // 2
    head = data[:keep].decode("utf-8", "ignore")
    tail = data[len(data) - keep :].decode("utf-8", "ignore")
    return f"{head}...[agentrl: {len(data) - 2 * keep:,} bytes cut]...{tail}"


def _cut_any(value: Any, budget: int) -> Any:
    if isinstance(value, str):
        return cut(value, budget)
    if isinstance(value, list):
        return [_cut_any(v, budget) for v in value]
    if isinstance(value, dict):
        return {k: _cut_any(v, budget) for k, v in value.items()}
    return value


def _trim(doc: dict[str, Any], budget: int) -> None:
    for turn in doc.get("turns") or []:
        obs = turn.get("observation") or {}
        obs["content"] = _cut_any(obs.get("content"), budget)
        act = turn.get("action") or {}
        for k in ("raw_response", "error"):
            if isinstance(act.get(k), str):
                act[k] = cut(act[k], budget)
        if act.get("tool_args") and len(json.dumps(act["tool_args"])) > budget:
            act["tool_args"] = {"_truncated": cut(json.dumps(act["tool_args"]), budget)}
        if act.get("tool_calls"):
            act["tool_calls"] = _cut_any(act["tool_calls"], budget)
        res = turn.get("result") or {}
        if "output" in res:
            res["output"] = _cut_any(res["output"], budget)
        if isinstance(res.get("error"), str):
            res["error"] = cut(res["error"], budget)
        turn["thought_process"] = [cut(t, budget) for t in turn.get("thought_process") or []]
    task = doc.get("task_context") or {}
    task["instructions"] = cut(task.get("instructions") or "", budget)
    meta = doc.get("metadata") or {}
    for t in meta.get("threads") or []:
        t["task"] = cut(t.get("task") or "", budget)
    cap = meta.get("capture") or {}
    for k in ("system_prompt", "comment", "correction"):
        if isinstance(cap.get(k), str):
            cap[k] = cut(cap[k], budget)


def fit(event: TrajectoryEvent, max_bytes: int) -> TrajectoryEvent | None:
    """`event` with its texts cut until its JSON fits in `max_bytes` (less headroom)."""
    limit = max(max_bytes - HEADROOM, 1024)
    original = len(event.to_json())
    base = json.loads(event.to_json())
    for budget in BUDGETS:
        doc = json.loads(json.dumps(base))
        _trim(doc, budget)
        cap = doc.setdefault("metadata", {}).setdefault("capture", {})
        cap["trimmed"] = {"max_text_bytes": budget, "original_bytes": original}
        small = TrajectoryEvent.model_validate_json(json.dumps(doc))
        if len(small.to_json()) <= limit:
            return small
    return None
