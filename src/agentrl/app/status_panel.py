"""The live status panel of `agentrl up`: services, streams and consumer lag, rewards/s, the
training queue, model versions and their traffic.

Every section is read from what the services publish (JetStream stream and consumer info, the
control API, the `agentrl_models` KV bucket), never from their internals; a section that cannot
be read shows "n/a" instead of stopping the panel. Without a terminal it prints one line per
change of a service's state instead of redrawing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from agentrl.bus.kv import kv_keys


class RunningStack(Protocol):
    """What the panel reads of a started stack (`agentrl.app.stack.RunningStack`), so the
    panel depends on its shape, not on the module that runs it."""

    bus: Any
    stop: asyncio.Event
    settings: Any

    @property
    def health(self) -> Mapping[str, Any]: ...

    @property
    def api_url(self) -> str: ...


REGISTRY_BUCKET = "agentrl_models"


async def stream_rows(stack: RunningStack) -> list[dict[str, Any]]:
    """Messages and bytes per stream, and per durable consumer its pending + unacked count."""
    from agentrl.contracts.streams import STREAMS

    rows: list[dict[str, Any]] = []
    for spec in STREAMS:
        try:
            info = await stack.bus.js.stream_info(spec.name)
        except Exception:
            continue
        consumers: list[str] = []
        with contextlib.suppress(Exception):
            for c in await stack.bus.js.consumers_info(spec.name):
                lag = (c.num_pending or 0) + (c.num_ack_pending or 0)
                consumers.append(f"{c.name}: lag {lag}, redelivered {c.num_redelivered or 0}")
        rows.append(
            {
                "stream": spec.name,
                "messages": info.state.messages,
                "bytes": info.state.bytes,
                "consumers": "; ".join(consumers) or "-",
            }
        )
    return rows


async def model_rows(stack: RunningStack) -> list[dict[str, Any]]:
    """Model versions from the registry bucket, with state and traffic weight."""
    rows: list[dict[str, Any]] = []
    try:
        kv = await stack.bus.js.key_value(REGISTRY_BUCKET)
        keys = await kv_keys(kv)
    except Exception:
        return rows
    for key in keys:
        with contextlib.suppress(Exception):
            entry = await kv.get(key)
            doc = json.loads(entry.value or b"{}")
            if isinstance(doc, dict) and ("state" in doc or "traffic_weight" in doc):
                rows.append(
                    {
                        "version": doc.get("version") or doc.get("model_id") or key,
                        "state": doc.get("state", "?"),
                        "traffic": doc.get("traffic_weight", doc.get("weight", "")),
                    }
                )
    return rows


async def job_rows(stack: RunningStack) -> list[dict[str, Any]]:
    """Queued and running training jobs from the control API."""
    import httpx

    from agentrl.app.tls import client_tls

    token = next(  # a token that may read jobs (the first one may lack the scope)
        (t for t, s in stack.settings.api_tokens.items() if {"training:read", "*"} & set(s)),
        None,
    )
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with httpx.AsyncClient(timeout=1.0, verify=client_tls()) as client:
            resp = await client.get(f"{stack.api_url}/training", headers=headers)
        jobs = resp.json()
    except Exception:
        return []
    items = jobs.get("jobs", jobs) if isinstance(jobs, dict) else jobs
    rows = []
    for job in items if isinstance(items, list) else []:
        if job.get("status") in ("queued", "running"):
            progress = job.get("progress") or {}
            rows.append(
                {
                    "job": str(job.get("job_id", ""))[:8],
                    "status": job.get("status"),
                    "progress": f"{progress.get('percent_complete', progress.get('percent', 0)):.0f} %"
                    if isinstance(progress, dict)
                    else "",
                }
            )
    return rows


def _table(title: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    if not rows:
        table.add_column("n/a")
        return table
    for key in rows[0]:
        table.add_column(key)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    return table


async def render(stack: RunningStack, rewards_per_s: float) -> Group:
    services = [
        {
            "service": h.name,
            "state": h.state,
            "restarts": h.restarts,
            "last error": h.last_error or "",
        }
        for h in stack.health.values()
    ]
    streams, jobs, models = await asyncio.gather(
        stream_rows(stack), job_rows(stack), model_rows(stack)
    )
    return Group(
        _table("services", services),
        _table(f"streams (rewards/s {rewards_per_s:.1f})", streams),
        _table("training jobs", jobs),
        _table("model versions", models),
    )


async def _rewards_count(stack: RunningStack) -> int:
    try:
        info = await stack.bus.js.stream_info("RL_REWARDS")
        return int(info.state.messages)
    except Exception:
        return 0


async def run_panel(stack: RunningStack, console: Console, refresh_s: float = 1.0) -> None:
    """Show the panel until the stack's stop event is set."""
    if not console.is_terminal:
        await _log_changes(stack, console)
        return
    last_count, last_t = await _rewards_count(stack), time.monotonic()
    with Live(console=console, refresh_per_second=2, transient=False) as live:
        while not stack.stop.is_set():
            count, now = await _rewards_count(stack), time.monotonic()
            rate = (count - last_count) / max(now - last_t, 1e-6)
            last_count, last_t = count, now
            with contextlib.suppress(Exception):
                live.update(await render(stack, rate))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stack.stop.wait(), refresh_s)


async def _log_changes(stack: RunningStack, console: Console) -> None:
    seen: dict[str, tuple[str, int]] = {}
    while not stack.stop.is_set():
        for h in stack.health.values():
            now = (h.state, h.restarts)
            if seen.get(h.name) != now:
                seen[h.name] = now
                extra = f" ({h.last_error})" if h.last_error and h.state != "running" else ""
                console.print(f"[service] {h.name}: {h.state}, restarts {h.restarts}{extra}")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stack.stop.wait(), 1.0)
