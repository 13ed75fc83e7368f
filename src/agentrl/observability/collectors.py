"""Scrape-time collectors: read JetStream's own numbers (stream depth, consumer lag,
redeliveries) into gauges just before `/metrics` is rendered.

A collector is `async def collect(bus) -> None`. Each runs under a timeout; one that fails is
logged (once per failure streak), counted in `agent_rl_metrics_collector_errors_total` and
skipped, so a slow or broken NATS never breaks the scrape of the other metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.contracts.streams import STREAMS
from agentrl.observability import metrics as m

log = logging.getLogger(__name__)

Collector = Callable[[Any], Awaitable[None]]


async def collect_streams(bus: Any) -> None:
    """Messages and bytes per stream, and for each durable consumer its lag (pending),
    unacknowledged and redelivered counts."""
    js = bus.js
    for spec in STREAMS:
        try:
            info = await js.stream_info(spec.name)
        except Exception as exc:  # a stream that does not exist (yet) is not an error
            if type(exc).__name__ == "NotFoundError":
                continue
            raise
        stream = m.STREAM(spec.name)
        m.set_gauge(m.BUS_STREAM_MESSAGES, float(info.state.messages), stream=stream)
        m.set_gauge(m.BUS_STREAM_BYTES, float(info.state.bytes), stream=stream)
        for c in await js.consumers_info(spec.name):
            name = c.name or ""
            if not c.config.durable_name:  # ephemeral readers come and go: not a service
                continue
            labels = {"stream": stream, "consumer": m.CONSUMER(name)}
            m.set_gauge(m.BUS_CONSUMER_PENDING, float(c.num_pending or 0), **labels)
            m.set_gauge(m.BUS_CONSUMER_ACK_PENDING, float(c.num_ack_pending or 0), **labels)
            m.set_gauge(m.BUS_CONSUMER_REDELIVERED, float(c.num_redelivered or 0), **labels)


COLLECTORS: dict[str, Collector] = {"jetstream": collect_streams}
_failing: set[str] = set()


async def run_collectors(
    bus: Any, collectors: dict[str, Collector] | None = None, timeout_s: float = 3.0
) -> dict[str, str]:
    """Run every collector; returns {name: "ok" | "error: ..."}. Never raises."""
    results: dict[str, str] = {}
    if bus is None:
        return results
    for name, collect in (collectors if collectors is not None else COLLECTORS).items():
        label = m.COLLECTOR(name)
        try:
            await asyncio.wait_for(collect(bus), timeout_s)
        except Exception as exc:
            results[name] = f"error: {type(exc).__name__}: {exc}"
            m.inc(m.COLLECTOR_ERRORS, collector=label)
            if name not in _failing:
                log.warning("metrics collector %s failed, skipped: %r", name, exc)
            _failing.add(name)
            continue
        if name in _failing:
            log.info("metrics collector %s recovered", name)
            _failing.discard(name)
        m.set_gauge(m.COLLECTOR_LAST_SUCCESS, time.time(), collector=label)
        results[name] = "ok"
    return results
