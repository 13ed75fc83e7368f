"""`POST /v1/traces` on the control API: an OTLP/HTTP trace receiver (protobuf or JSON).

Spans are kept per trace until the trace's root span arrives (it ends last, so its export
comes last), or until the trace has been idle `otlp_idle_s` (checked on every request); then
the trace becomes a trajectory (`agentrl.capture.otlp`), redacted, published and indexed like
the gateway's episodes. Bounded: `otlp_max_traces` open traces (the least recently active
go first) and `otlp_max_spans` spans per trace (later ones dropped, the trajectory marked
truncated). A malformed body is a 400 with the reason, counted; nothing is half-read.
Scope `traces:write` when API tokens are configured.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from agentrl.apiauth import require_scope
from agentrl.capture.otlp import OtlpError, Span, TraceEpisode, decode, to_trajectory_from_spans
from agentrl.capture.service import CaptureService
from agentrl.capture.settings import CaptureSettings

log = logging.getLogger(__name__)

router = APIRouter(tags=["capture"])
MAX_BODY = 32 * 2**20


@dataclass
class TraceBook:
    """Open traces, least recently active first."""

    max_spans: int
    max_traces: int
    idle_s: float
    traces: OrderedDict[str, TraceEpisode] = field(default_factory=OrderedDict)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "requests",
                "bad_requests",
                "spans",
                "spans_dropped",
                "traces_closed",
                "traces_idle",
                "traces_evicted",
                "traces_without_llm_spans",
                "published",
                "publish_failed",
            ),
            0,
        )
    )

    def add(self, spans: list[Span], now: float) -> list[TraceEpisode]:
        """Add spans; returns the traces now complete (root seen) or pushed out."""
        done: list[TraceEpisode] = []
        for s in spans:
            t = self.traces.get(s.trace_id)
            if t is None:
                t = self.traces[s.trace_id] = TraceEpisode(s.trace_id)
            self.traces.move_to_end(s.trace_id)
            t.last_seen = now
            self.counts["spans"] += 1
            if len(t.spans) >= self.max_spans:
                t.dropped += 1
                self.counts["spans_dropped"] += 1
            else:
                t.spans.append(s)
            if not s.parent_id:
                t.root_seen = True
        for t in list(self.traces.values()):
            if t.root_seen:
                done.append(self.traces.pop(t.trace_id))
                self.counts["traces_closed"] += 1
        while len(self.traces) > self.max_traces:
            done.append(self.traces.popitem(last=False)[1])
            self.counts["traces_evicted"] += 1
        return done

    def expire(self, now: float) -> list[TraceEpisode]:
        out = []
        while self.traces:
            t = next(iter(self.traces.values()))
            if now - t.last_seen < self.idle_s:
                break
            out.append(self.traces.popitem(last=False)[1])
            self.counts["traces_idle"] += 1
        return out


class OtlpReceiver:
    def __init__(self, bus: Any, settings: CaptureSettings | None = None) -> None:
        s = settings or CaptureSettings()
        self.book = TraceBook(s.otlp_max_spans, s.otlp_max_traces, s.otlp_idle_s)
        self.publisher = CaptureService(bus, s)
        self.max_turns = s.max_turns

    async def receive(self, spans: list[Span]) -> list[str]:
        """Take spans in; publish the traces that are complete. Returns their trajectory ids."""
        now = time.monotonic()
        ready = self.book.add(spans, now) + self.book.expire(now)
        built = []
        for trace in ready:
            traj = to_trajectory_from_spans(trace, self.max_turns)
            if traj is None:
                self.book.counts["traces_without_llm_spans"] += 1
            else:
                built.append((trace, traj))
        if not built:
            return []
        try:
            await self.publisher.publish_many([t for _, t in built])
        except Exception:  # kept: the next request (or expiry) tries them again
            self.book.counts["publish_failed"] += len(built)
            for trace, _ in built:
                self.book.traces.setdefault(trace.trace_id, trace)
            log.warning("otlp: could not publish %d traces", len(built), exc_info=True)
            return []
        self.book.counts["published"] += len(built)
        return [t.trajectory_id for _, t in built]


def receiver(request: Request) -> OtlpReceiver:
    rec: OtlpReceiver | None = getattr(request.app.state, "otlp_receiver", None)
    if rec is None:
        rec = request.app.state.otlp_receiver = OtlpReceiver(request.app.state.bus)
    return rec


@router.post(
    "/v1/traces",
    dependencies=[Depends(require_scope("traces:write"))],
    summary="OTLP/HTTP trace export (GenAI / OpenInference spans -> trajectories)",
    response_model=None,
)
async def traces(request: Request) -> Any:
    if request.app.state.bus is None:
        return JSONResponse({"detail": "no event bus connected"}, 503)
    rec = receiver(request)
    rec.book.counts["requests"] += 1
    ctype = request.headers.get("content-type", "application/x-protobuf")
    try:
        body = await request.body()
    except ClientDisconnect:  # the exporter gave up: nothing was read, nothing to answer
        return Response(status_code=400)
    if len(body) > MAX_BODY:
        rec.book.counts["bad_requests"] += 1
        return JSONResponse(
            {"detail": f"body over {MAX_BODY} bytes: export in smaller batches"}, 413
        )
    try:
        spans = decode(body, ctype, request.headers.get("content-encoding"))
    except OtlpError as exc:
        rec.book.counts["bad_requests"] += 1
        return JSONResponse({"detail": f"malformed OTLP body: {exc}"}, 400)
    ids = await rec.receive(spans)
    if ctype.startswith("application/json"):
        return JSONResponse({"partialSuccess": {}, "trajectory_ids": ids})
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    return Response(
        ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf"
    )


@router.get("/v1/traces/stats", summary="OTLP receiver counters")
async def trace_stats(request: Request) -> dict[str, Any]:
    rec = receiver(request)
    return {"open_traces": len(rec.book.traces), **rec.book.counts}
