"""Episodes at the gateway: the gateway hands each served request here; closed episodes are
redacted and published on `agent.rl.trajectory.v1`, off the request path.

`observe` runs inside the request (a dict lookup, a list slice, one small JSON size
estimate, never an exception); closing, redaction, publishing and the index writes run in
`run`'s task. `POST /v1/episodes/{id}/end` (mounted on the gateway app) closes an episode
with an optional outcome and returns once it is published, so feedback can name it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agentrl.capture.episodes import Closed, EpisodeBook, outcome_of, to_trajectory
from agentrl.capture.index import TrajectoryIndex
from agentrl.capture.settings import CaptureSettings
from agentrl.contracts.base import utcnow
from agentrl.contracts.trajectory import TrajectoryEvent

log = logging.getLogger(__name__)

OPT_OUT_HEADER = "x-agentrl-capture"  # "off" (or false/0/no): this request is not captured
AGENT_HEADER = "x-agentrl-agent"  # optional: the trajectory's agent_id
_OFF = frozenset({"off", "false", "0", "no", "none"})


@dataclass
class CaptureCounts:
    no_session: int = 0  # served without a session key: only logged
    opted_out: int = 0
    observe_errors: int = 0
    published: int = 0
    publish_failed: int = 0
    outbox_dropped: int = 0
    redacted: int = 0  # trajectories in which PII was replaced
    empty: int = 0


class EndRequest(BaseModel):
    """The optional outcome of an episode."""

    model_config = ConfigDict(extra="forbid")

    success: bool | None = None
    score: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    comment: str | None = Field(None, max_length=20_000)


class CaptureService:
    def __init__(self, bus: Any, settings: CaptureSettings | None = None) -> None:
        self.bus = bus
        self.settings = settings or CaptureSettings()
        s = self.settings
        self.book = EpisodeBook(s.max_open, s.max_bytes, s.max_turns)
        self.outbox: deque[tuple[Closed, Any, str | None]] = deque()
        self.counts = CaptureCounts()
        self.index: TrajectoryIndex | None = None
        self._wake = asyncio.Event()
        self.observe_s: deque[tuple[float, float]] | None = None  # a deque: time `observe`

    # ---- on the request path --------------------------------------------------------------
    def wants(self, headers: Mapping[str, str], session: str | None) -> bool:
        """Whether this request joins an episode (a session key, no opt-out header)."""
        if (headers.get(OPT_OUT_HEADER) or "").strip().lower() in _OFF:
            self.counts.opted_out += 1
            return False
        if not session:
            self.counts.no_session += 1
            return False
        return True

    def observe(
        self,
        headers: Mapping[str, str],
        session: str,
        messages: list[Any],
        gen: Any,
        completion_id: str,
        model_id: str,
    ) -> None:
        """One served request (`gen`: the backend's Generation). Never raises."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            answer = {"content": gen.content, "tool_calls": gen.tool_calls}
            closed = self.book.observe(
                session,
                messages,
                answer,
                completion_id,
                model_id,
                now=time.monotonic(),
                at=utcnow(),
                tokens=int(gen.prompt_tokens + gen.completion_tokens),
                agent_id=headers.get(AGENT_HEADER) or "openai-client",
            )
        except Exception:
            self.counts.observe_errors += 1
            log.warning("capture: could not record a request of %s", session, exc_info=True)
            return
        for c in closed:
            self._queue(c, None, None)
        if self.observe_s is not None:  # (wall, this thread's CPU) seconds
            self.observe_s.append((time.perf_counter() - t0, time.thread_time() - c0))

    # ---- closing and publishing ------------------------------------------------------------
    def _queue(self, closed: Closed, outcome: Any, comment: str | None) -> None:
        if len(self.outbox) >= self.settings.outbox:
            self.outbox.popleft()
            self.counts.outbox_dropped += 1
        self.outbox.append((closed, outcome, comment))
        self._wake.set()

    async def end(self, key: str, body: EndRequest | None = None) -> TrajectoryEvent | None:
        """Close episode `key` now and publish it; None when no such episode is open."""
        ep = self.book.end(key)
        if ep is None:
            return None
        b = body or EndRequest()
        closed, outcome = Closed(ep, "ended"), outcome_of(b.success, b.score)
        event = self.trajectory(closed, outcome, b.comment)
        if event is not None:
            try:
                await self.publish(event)
            except Exception:
                self._queue(closed, outcome, b.comment)  # `run` retries it
                raise
        return event

    def trajectory(
        self, closed: Closed, outcome: Any, comment: str | None
    ) -> TrajectoryEvent | None:
        event = to_trajectory(
            closed.episode,
            ended_at=utcnow(),
            reason=closed.reason,
            outcome=outcome,
            comment=comment,
        )
        if event is None:
            self.counts.empty += 1
        return event

    async def publish(self, event: TrajectoryEvent) -> None:
        """Redact, publish (Msg-Id = trajectory id) and index one trajectory."""
        await self.publish_many([event])

    async def publish_many(self, events: list[TrajectoryEvent]) -> None:
        """Redact, publish (pipelined, Msg-Id = trajectory id) and index trajectories."""
        from agentrl.rewards.redact import redact_event

        cleaned = []
        for event in events:
            clean, found = redact_event(event)
            self.counts.redacted += bool(found)
            cleaned.append(clean)
        await self.bus.publish_many(cleaned)
        self.counts.published += len(cleaned)
        try:
            if self.index is None:
                s = self.settings
                self.index = await TrajectoryIndex.open(self.bus.js, s.index_bucket, s.index_ttl_s)
            await asyncio.gather(*(self._index(self.index, c) for c in cleaned))
        except Exception:  # feedback by trajectory id still works
            log.warning("capture: could not index %d trajectories", len(cleaned), exc_info=True)

    @staticmethod
    async def _index(index: TrajectoryIndex, event: TrajectoryEvent) -> None:
        capture = (event.metadata.model_extra or {}).get("capture") or {}
        episodes = sorted({str(capture.get("episode_id") or ""), event.session_id} - {""})
        for i, episode in enumerate(episodes):
            ids = list(capture.get("completion_ids") or []) if i == 0 else []
            await index.put(event.trajectory_id, episode, ids)

    async def flush(self, batch: int = 256) -> None:
        """Publish everything closed so far, in batches (a failure leaves it queued, raises)."""
        while self.outbox:
            items = [self.outbox[i] for i in range(min(batch, len(self.outbox)))]
            events = [e for e in (self.trajectory(*it) for it in items) if e is not None]
            if events:
                await self.publish_many(events)
            for it in items:  # by identity: the outbox may have moved meanwhile
                if self.outbox and self.outbox[0] is it:
                    self.outbox.popleft()

    async def run(self, stop: asyncio.Event, tick_s: float = 1.0) -> None:
        """Close idle episodes and publish closed ones until `stop`; then close the rest."""
        while not stop.is_set():
            for c in self.book.expire(time.monotonic(), self.settings.idle_timeout_s):
                self._queue(c, None, None)
            try:
                await self.flush()
            except Exception:
                self.counts.publish_failed += 1
                log.warning("capture: publishing failed; will retry", exc_info=True)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), tick_s)
        for c in self.book.close_all():
            self._queue(c, None, None)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), 10)

    def router(self) -> APIRouter:
        """The gateway's episode routes (the gateway mounts them when capture is on)."""
        return gateway_router(self)

    def stats(self) -> dict[str, Any]:
        return {
            "open": len(self.book.open),
            "open_bytes": self.book.bytes,
            "outbox": len(self.outbox),
            **self.book.counts.as_dict(),
            **self.counts.__dict__,
        }


def gateway_router(service: CaptureService) -> APIRouter:
    """`POST /v1/episodes/{id}/end` and `GET /v1/episodes/stats`, for the gateway app."""
    router = APIRouter(tags=["episodes"])

    def denied(request: Request) -> JSONResponse | None:
        keys = getattr(getattr(request.app.state, "gateway", None), "api_keys", None) or []
        if not keys:
            return None
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and any(
            hmac.compare_digest(token.strip().encode(), k.encode()) for k in keys
        ):
            return None
        return JSONResponse({"error": {"message": "missing or wrong API key"}}, status_code=401)

    @router.post("/v1/episodes/{episode_id}/end", response_model=None)
    async def end(episode_id: str, request: Request) -> Any:
        if (no := denied(request)) is not None:
            return no
        raw = await request.body()
        try:
            body = EndRequest.model_validate_json(raw) if raw.strip() else EndRequest()
        except ValueError as exc:
            return JSONResponse({"error": {"message": f"invalid outcome: {exc}"}}, 400)
        try:
            event = await service.end(episode_id, body)
        except Exception as exc:
            log.warning("capture: could not publish episode %s", episode_id, exc_info=True)
            return JSONResponse(
                {"error": {"message": f"episode closed but not published yet: {exc}"}}, 503
            )
        if event is None:
            return JSONResponse(
                {
                    "error": {
                        "message": f"no open episode {episode_id!r} (ended already, idle "
                        "timeout, or its requests carried no session key)"
                    }
                },
                404,
            )
        return {
            "episode_id": episode_id,
            "trajectory_id": event.trajectory_id,
            "turns": len(event.turns),
            "serving_versions": (event.metadata.model_extra or {}).get("serving_versions"),
            "published": True,
        }

    @router.get("/v1/episodes/stats")
    async def stats() -> dict[str, Any]:
        return service.stats()

    return router
