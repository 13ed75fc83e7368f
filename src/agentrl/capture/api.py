"""`POST /v1/traces` on the control API: an OTLP/HTTP trace receiver (protobuf or JSON).

Spans are kept per trace until the trace's root span arrives (it ends last, so its export
comes last), or until the trace has been idle `otlp_idle_s` (a timer checks); then the trace
becomes a trajectory (`agentrl.capture.otlp`), redacted, published and indexed like the
gateway's episodes. A trace whose chat calls this gateway served inside an episode (their
response ids are its completion ids) is not published again: it enriches that episode
(durations, tool spans), so one agent run is one trajectory however it is observed. A
gateway in another process is found through the capture index (its completion ids and the
tool call ids it minted); the extras then go over NATS to the capture service that holds
the episode open (`ENRICH_SUBJECT`), which folds them in and answers.

Bounded in memory, since it runs beside every service: the body is read as a stream and
refused past `otlp_max_body_bytes`, a gzip body is inflated to at most
`otlp_max_decoded_bytes`, each span keeps at most `otlp_max_attrs` attributes of at most
`otlp_max_attr_bytes` each, and open traces are capped in count (`otlp_max_traces`), in
bytes (`otlp_max_bytes`) and in spans per trace (`otlp_max_spans`; later ones dropped,
the trajectory marked truncated); the least recently active go first. A malformed body is
a 400 with the reason, an oversized one a 413, counted; nothing is half-read.
Scope `traces:write` when API tokens are configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from agentrl.capture.fit import cut
from agentrl.capture.index import CALL, COMPLETION
from agentrl.capture.otlp import (
    OtlpError,
    OtlpTooLarge,
    Span,
    TraceEpisode,
    capped,
    decode,
    enrichment_of,
    llm_response_ids,
    name_completions,
    span_bytes,
    to_trajectory_from_spans,
    unnamed_call_ids,
)
from agentrl.capture.service import ENRICH_SUBJECT, CaptureService, live_services
from agentrl.capture.settings import CaptureSettings
from agentrl.core.apiauth import require_scope

log = logging.getLogger(__name__)

router = APIRouter(tags=["capture"])


@dataclass
class TraceBook:
    """Open traces, least recently active first."""

    max_spans: int
    max_traces: int
    idle_s: float
    max_bytes: int = 64 * 2**20
    max_attrs: int = 256
    max_attr_bytes: int = 2**20
    bytes: int = 0
    traces: OrderedDict[str, TraceEpisode] = field(default_factory=OrderedDict)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "requests",
                "bad_requests",
                "spans",
                "spans_dropped",
                "attrs_capped",
                "too_large",
                "traces_closed",
                "traces_idle",
                "traces_evicted",
                "traces_without_llm_spans",
                "published",
                "publish_failed",
                "joined_to_episodes",
                "joined_in_another_process",
                "joined_after_publish",
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
                s, hit = capped(s, self.max_attrs, self.max_attr_bytes)
                self.counts["attrs_capped"] += hit
                n = span_bytes(s)
                t.spans.append(s)
                t.bytes += n
                self.bytes += n
            if not s.parent_id:
                t.root_seen = True
        for t in list(self.traces.values()):
            if t.root_seen:
                done.append(self._pop(t.trace_id))
                self.counts["traces_closed"] += 1
        while self.traces and (len(self.traces) > self.max_traces or self.bytes > self.max_bytes):
            done.append(self._pop(next(iter(self.traces))))
            self.counts["traces_evicted"] += 1
        return done

    def _pop(self, trace_id: str) -> TraceEpisode:
        t = self.traces.pop(trace_id)
        self.bytes -= t.bytes
        return t

    def put_back(self, t: TraceEpisode) -> None:
        if t.trace_id not in self.traces:
            self.traces[t.trace_id] = t
            self.bytes += t.bytes

    def expire(self, now: float) -> list[TraceEpisode]:
        out = []
        while self.traces:
            t = next(iter(self.traces.values()))
            if now - t.last_seen < self.idle_s:
                break
            out.append(self._pop(t.trace_id))
            self.counts["traces_idle"] += 1
        return out


class OtlpReceiver:
    def __init__(self, bus: Any, settings: CaptureSettings | None = None) -> None:
        s = settings or CaptureSettings()
        self.settings = s
        self.book = TraceBook(
            s.otlp_max_spans,
            s.otlp_max_traces,
            s.otlp_idle_s,
            s.otlp_max_bytes,
            s.otlp_max_attrs,
            s.otlp_max_attr_bytes,
        )
        self.publisher = CaptureService(bus, s)
        self.max_turns = s.max_turns
        self.timer: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def start(self) -> None:
        """Expire idle traces on a timer, not only when the next export comes."""
        if self.timer is None or self.timer.done():
            self.timer = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        every = max(0.05, min(self.book.idle_s / 4, 1.0))
        while True:
            await asyncio.sleep(every)
            with contextlib.suppress(Exception):
                await self.receive([])

    async def _served_here(self, rids: list[str]) -> tuple[dict[str, str | None], Any]:
        """The response ids this gateway served: id -> trajectory id of its episode (None:
        served outside an episode); and the in-process capture service that has them."""
        found: dict[str, str | None] = {}
        where = None
        for svc in live_services():
            if svc is self.publisher:
                continue
            for rid in rids:
                ours, tid = svc.owns(rid)
                if ours:
                    found[rid] = tid
                    where = where or (svc if tid else None)
        missing = [r for r in rids if r not in found]
        if missing:  # a gateway in another process: its index names its completions
            with contextlib.suppress(Exception):
                index = await self.publisher._index_open()
                got = await asyncio.gather(*(index.get(COMPLETION, r) for r in missing))
                found.update({r: t for r, t in zip(missing, got, strict=True) if t})
        return found, where

    async def _name_from_index(self, trace: TraceEpisode) -> None:
        """Chat spans without a response id whose tool calls a gateway in another process
        minted: named by the completion the capture index holds for those call ids."""
        calls = unnamed_call_ids(trace)
        if not calls:
            return
        try:
            index = await self.publisher._index_open()
            got = await asyncio.gather(*(index.get(CALL, c) for c in calls))
        except Exception:  # no index: the trace stands on its own
            log.warning("otlp: capture index unavailable for tool call ids", exc_info=True)
            return
        named = {c: cid for c, cid in zip(calls, got, strict=True) if cid}
        if named:
            name_completions(trace, named.get)

    async def _enrich_remote(self, tid: str, cids: list[str], data: dict[str, Any]) -> bool:
        """Send a trace's extras to the process whose gateway holds episode `tid` open (it
        answers; nobody answers when the episode was published already). True: folded in."""
        nc = getattr(self.publisher.bus, "nc", None)
        if nc is None:
            return False
        payload = json.dumps({"completion_ids": cids, "data": data}).encode()
        limit = int(getattr(nc, "max_payload", 0) or 0)
        if limit and len(payload) > limit:  # long tool outputs cut, head and tail kept
            each = max(256, limit // 2 // max(1, len(data.get("tools") or [])))
            for t in data.get("tools") or []:
                if isinstance(t.get("output"), str):
                    t["output"] = cut(t["output"], each)
            payload = json.dumps({"completion_ids": cids, "data": data}).encode()
        try:
            reply = await nc.request(
                f"{ENRICH_SUBJECT}.{tid}", payload, timeout=self.settings.enrich_timeout_s
            )
            return bool(json.loads(reply.data).get("enriched"))
        except Exception as exc:  # no responder, timeout, too big: published without it
            log.info(
                "otlp: trace %s not folded into episode %s: %r", data.get("trace_id"), tid, exc
            )
            return False

    async def receive(self, spans: list[Span]) -> list[str]:
        """Take spans in; publish the traces that are complete (or join them to the gateway
        episode that served them). Returns the trajectory ids published."""
        async with self._lock:  # the timer and requests: one at a time
            now = time.monotonic()
            ready = self.book.add(spans, now) + self.book.expire(now)
            built = []
            services = [svc for svc in live_services() if svc is not self.publisher]
            remote = []
            for trace in ready:
                for other in services:
                    name_completions(trace, other.completion_of_call)
                await self._name_from_index(trace)
                rids = llm_response_ids(trace)
                ours, svc = await self._served_here(rids) if rids else ({}, None)
                tids = [t for t in ours.values() if t]
                if tids:  # the gateway captured this run: enrich it, never publish it twice
                    joined = [r for r in rids if ours.get(r)]
                    if svc is not None and svc.enrich(tids[0], joined, enrichment_of(trace)):
                        self.book.counts["joined_to_episodes"] += 1
                    elif svc is None:  # served by a gateway in another process
                        remote.append(self._enrich_remote(tids[0], joined, enrichment_of(trace)))
                    else:
                        self.book.counts["joined_after_publish"] += 1
                    continue
                traj = to_trajectory_from_spans(trace, self.max_turns, owns=ours.__contains__)
                if traj is None:
                    self.book.counts["traces_without_llm_spans"] += 1
                else:
                    built.append((trace, traj))
            for done in await asyncio.gather(*remote):
                key = "joined_in_another_process" if done else "joined_after_publish"
                self.book.counts[key] += 1
                self.book.counts["joined_to_episodes"] += done
            if not built:
                return []
            try:
                await self.publisher.publish_many([t for _, t in built])
            except Exception:  # kept: the timer (or the next request) tries them again
                self.book.counts["publish_failed"] += len(built)
                for trace, _ in built:
                    self.book.put_back(trace)
                log.warning("otlp: could not publish %d traces", len(built), exc_info=True)
                return []
            self.book.counts["published"] += len(built)
            return [t.trajectory_id for _, t in built]


def receiver(request: Request) -> OtlpReceiver:
    rec: OtlpReceiver | None = getattr(request.app.state, "otlp_receiver", None)
    if rec is None:
        rec = request.app.state.otlp_receiver = OtlpReceiver(request.app.state.bus)
    rec.start()
    return rec


async def read_limited(request: Request, limit: int) -> bytes | None:
    """The body, read as it streams in; None once it passes `limit` bytes (not kept)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
    return b"".join(parts)


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
    limit = rec.settings.otlp_max_body_bytes
    try:
        body = await read_limited(request, limit)
    except ClientDisconnect:  # the exporter gave up: nothing was read, nothing to answer
        return Response(status_code=400)
    if body is None:
        rec.book.counts["too_large"] += 1
        return JSONResponse({"detail": f"body over {limit} bytes: export in smaller batches"}, 413)
    try:
        spans = decode(
            body,
            ctype,
            request.headers.get("content-encoding"),
            rec.settings.otlp_max_decoded_bytes,
        )
    except OtlpTooLarge as exc:
        rec.book.counts["too_large"] += 1
        return JSONResponse({"detail": str(exc)}, 413)
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
    return {"open_traces": len(rec.book.traces), "open_bytes": rec.book.bytes, **rec.book.counts}
