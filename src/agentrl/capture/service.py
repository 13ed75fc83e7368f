"""Episodes at the gateway: the gateway hands each served (or failed) request here; closed
episodes are redacted and published on `agent.rl.trajectory.v1`, off the request path.

`observe` and `failed` run inside the request (dict lookups, a list slice, one small JSON
size estimate, never an exception); closing, redaction, publishing and the index writes run
in `run`'s task. `POST /v1/episodes/{id}/end` (mounted on the gateway app) closes an episode
with an optional outcome and returns once it is published, so feedback can name it at once.

The outbox never blocks on a permanent error: a trajectory over the server's max_payload is
trimmed by `agentrl.capture.fit` (long texts cut, head and tail kept, the cut marked), and
one that cannot be made to fit (or cannot be built at all) goes to the dead-letter stream
with the reason; the episodes behind it flow on. Closed episodes waiting in the outbox
count against the capture byte budget (`max_bytes`) with the open ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agentrl.capture.episodes import (
    Closed,
    EpisodeBook,
    OpenEpisode,
    outcome_of,
    to_trajectory,
    trajectory_id_of,
)
from agentrl.capture.fit import fit
from agentrl.capture.index import CALL, TrajectoryIndex
from agentrl.capture.settings import CaptureSettings
from agentrl.contracts.base import utcnow
from agentrl.contracts.trajectory import TrajectoryEvent

log = logging.getLogger(__name__)

OPT_OUT_HEADER = "x-agentrl-capture"  # "off" (or false/0/no): this request is not captured
AGENT_HEADER = "x-agentrl-agent"  # optional: the trajectory's agent_id
SESSION_HEADERS = ("x-agentrl-session", "x-episode-id", "x-session-id")  # as the gateway's
_OFF = frozenset({"off", "false", "0", "no", "none"})
OWNED = 100_000  # completion ids remembered as served here (the OTLP join, in process)
# Core NATS (no stream stores it): an OTLP receiver in another process sends a trace's
# enrichment to `ENRICH_SUBJECT.<trajectory id>`; the capture service that holds that
# episode open folds it in and answers, the others stay silent.
ENRICH_SUBJECT = "agentrl.capture.enrich"

_LIVE: weakref.WeakSet[CaptureService] = weakref.WeakSet()


def live_services() -> list[CaptureService]:
    """The capture services of this process (an OTLP receiver joins traces to them)."""
    return list(_LIVE)


@dataclass
class CaptureCounts:
    no_session: int = 0  # served without a session key or `user`: only logged
    opted_out: int = 0
    observe_errors: int = 0
    published: int = 0
    publish_failed: int = 0
    outbox_dropped: int = 0  # over the byte budget or the outbox's length (logged)
    trimmed: int = 0  # over max_payload: long texts cut to fit
    dead_lettered: int = 0  # could not be made to fit or built: RL_DLQ with the reason
    redacted: int = 0  # trajectories in which PII was replaced
    empty: int = 0
    enriched: int = 0  # OTLP traces folded into a gateway episode


@dataclass
class Outgoing:
    closed: Closed
    outcome: Any
    notes: dict[str, str]  # the caller's words at the end: comment, correction
    size: int


class EndRequest(BaseModel):
    """The optional outcome of an episode."""

    model_config = ConfigDict(extra="forbid")

    success: bool | None = None
    score: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    comment: str | None = Field(None, max_length=20_000)
    # what the agent should have done: a job's hint for this episode (rewards read it from
    # `metadata.capture.correction`)
    correction: str | None = Field(None, max_length=20_000)

    def notes(self) -> dict[str, str]:
        return {k: v for k, v in (("comment", self.comment), ("correction", self.correction)) if v}


def keys_of(headers: Mapping[str, str], body: Any) -> tuple[str | None, str | None]:
    """(session key, OpenAI `user`): a session key names an episode; `user` alone only
    scopes the routing of a request to the episode whose history it extends."""
    for h in SESSION_HEADERS:
        if headers.get(h):
            return headers[h], None
    if getattr(body, "episode_id", None):
        return str(body.episode_id), None
    meta = (getattr(body, "model_extra", None) or {}).get("metadata")
    if isinstance(meta, dict) and meta.get("session_id"):
        return str(meta["session_id"]), None
    user = getattr(body, "user", None)
    return None, (str(user) if user else None)


def owner_of(headers: Mapping[str, str]) -> str | None:
    """A digest of the caller's API key: episodes (and their `end`) are the key's own."""
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return hashlib.sha256(token.strip().encode()).hexdigest()[:16]


class CaptureService:
    def __init__(self, bus: Any, settings: CaptureSettings | None = None) -> None:
        self.bus = bus
        self.settings = settings or CaptureSettings()
        s = self.settings
        self.book = EpisodeBook(s.max_open, s.max_bytes, s.max_turns)
        self.outbox: deque[Outgoing] = deque()
        self.outbox_bytes = 0
        self.counts = CaptureCounts()
        self.index: TrajectoryIndex | None = None
        self.to_index: list[tuple[str, str]] = []  # (completion id, trajectory id) to write
        self.calls_to_index: list[tuple[str, str]] = []  # (tool call id, completion id)
        self.owned: OrderedDict[str, str | None] = OrderedDict()  # served here -> trajectory
        self.calls: OrderedDict[str, str] = OrderedDict()  # tool call id -> completion id
        self.keyed = lambda: False  # the gateway says whether API keys are required
        self._wake = asyncio.Event()
        self.observe_s: deque[tuple[float, float]] | None = None  # a deque: time `observe`
        _LIVE.add(self)

    # ---- on the request path --------------------------------------------------------------
    def wants(self, headers: Mapping[str, str], body: Any) -> bool:
        """Whether this request joins an episode (a session key or `user`, no opt-out)."""
        if (headers.get(OPT_OUT_HEADER) or "").strip().lower() in _OFF:
            self.counts.opted_out += 1
            return False
        session, user = keys_of(headers, body)
        if not (session or user):
            self.counts.no_session += 1
            return False
        return True

    def observe(
        self,
        headers: Mapping[str, str],
        body: Any,
        gen: Any,
        completion_id: str,
        model_id: str,
    ) -> None:
        """One served request (`gen`: the backend's Generation). Never raises."""
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            answer = {"content": gen.content, "tool_calls": gen.tool_calls}
            self._record(
                headers,
                body,
                answer,
                completion_id,
                model_id,
                gen.prompt_tokens + gen.completion_tokens,
            )
        except Exception:
            self.counts.observe_errors += 1
            log.warning("capture: could not record request %s", completion_id, exc_info=True)
            return
        if self.observe_s is not None:  # (wall, this thread's CPU) seconds
            self.observe_s.append((time.perf_counter() - t0, time.thread_time() - c0))

    def failed(
        self,
        headers: Mapping[str, str],
        body: Any,
        status: int,
        message: str,
        completion_id: str,
        model_id: str,
    ) -> None:
        """A request that got no answer (a timeout, a backend error): a failed turn of its
        episode, never a lost episode. Logged. Never raises."""
        try:
            key = self._record(
                headers, body, {}, completion_id, model_id, 0, error=message, status=status
            )
        except Exception:
            self.counts.observe_errors += 1
            log.warning("capture: could not record failed request %s", completion_id, exc_info=True)
            return
        log.warning(
            "capture: request %s of episode %s failed (%s: %s); recorded as a failed turn",
            completion_id,
            key,
            status,
            message,
        )

    def served(self, completion_id: str) -> None:
        """A completion served without an episode (no session key): still this gateway's."""
        self._own(completion_id, None)

    def _own(self, completion_id: str, trajectory_id: str | None) -> None:
        self.owned[completion_id] = trajectory_id
        if len(self.owned) > OWNED:
            self.owned.popitem(last=False)

    def _record(
        self,
        headers: Mapping[str, str],
        body: Any,
        answer: dict[str, Any],
        completion_id: str,
        model_id: str,
        tokens: int,
        error: str | None = None,
        status: int | None = None,
    ) -> str | None:
        session, user = keys_of(headers, body)
        owner = owner_of(headers) if self.keyed() else None
        closed = self.book.observe(
            session,
            list(getattr(body, "messages", None) or []),
            answer,
            completion_id,
            model_id,
            now=time.monotonic(),
            at=utcnow(),
            tokens=int(tokens),
            agent_id=headers.get(AGENT_HEADER) or "openai-client",
            owner=owner,
            user=user,
            error=error,
            status=status,
        )
        for c in closed:
            self._queue(c, None, {})
        bkey = self.book.by_completion.get(completion_id)
        ep = self.book.open.get(bkey) if bkey else None
        if ep is None:
            return session
        tid = trajectory_id_of(ep)
        if error is None:
            self._own(completion_id, tid)
            self.to_index.append((completion_id, tid))
            if len(self.to_index) > OWNED:  # no run loop writing them (or NATS away long)
                del self.to_index[: len(self.to_index) - OWNED]
            for call in answer.get("tool_calls") or []:  # spans without response ids name these
                if isinstance(call, dict) and call.get("id"):
                    self.calls[str(call["id"])] = completion_id
                    self.calls_to_index.append((str(call["id"]), completion_id))
            while len(self.calls) > OWNED:
                self.calls.popitem(last=False)
            if len(self.calls_to_index) > OWNED:
                del self.calls_to_index[: len(self.calls_to_index) - OWNED]
            # written at once (batched with whatever else came meanwhile), not on the next
            # tick: a trace exported right after the run finds its completions in the index
            self._wake.set()
        return ep.episode_id

    # ---- the OTLP join (in process) ----------------------------------------------------------
    def owns(self, completion_id: str) -> tuple[bool, str | None]:
        """(served here, the trajectory id of its episode or None)."""
        if completion_id in self.owned:
            return True, self.owned[completion_id]
        return False, None

    def completion_of_call(self, call_id: str) -> str | None:
        """The completion that minted tool call `call_id` (ids are the gateway's own)."""
        return self.calls.get(call_id)

    def enrich(self, trajectory_id: str, completion_ids: list[str], data: dict[str, Any]) -> bool:
        """Fold an OTLP trace's extras into the open episode that served `completion_ids`;
        False when that episode is no longer open (it was published without them)."""
        for cid in completion_ids:
            bkey = self.book.by_completion.get(cid)
            if bkey is not None and trajectory_id_of(self.book.open[bkey]) == trajectory_id:
                self.book.open[bkey].enrichment.append(data)
                self.counts.enriched += 1
                return True
        return False

    async def _on_enrich(self, msg: Any) -> None:
        """An OTLP receiver in another process found one of this gateway's completions in a
        trace: fold the trace's extras in when the episode is open here, and say so. Silent
        otherwise (another replica may hold it); a bad message is logged, never raised."""
        tid = msg.subject.rsplit(".", 1)[-1]
        try:
            doc = json.loads(msg.data)
            cids = [str(c) for c in doc["completion_ids"]]
            data = dict(doc["data"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("capture: bad enrichment for %s: %s", tid, exc)
            return
        if self.enrich(tid, cids, data) and msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(b'{"enriched": true}')

    async def _subscribe(self) -> Any:
        nc = getattr(self.bus, "nc", None)
        if nc is None:
            return None
        try:
            return await nc.subscribe(f"{ENRICH_SUBJECT}.*", cb=self._on_enrich)
        except Exception:
            log.warning(
                "capture: no enrichment subscription (traces from another process "
                "will not enrich this gateway's episodes)",
                exc_info=True,
            )
            return None

    # ---- closing and publishing ------------------------------------------------------------
    def _queue(self, closed: Closed, outcome: Any, notes: dict[str, str]) -> None:
        item = Outgoing(closed, outcome, notes, closed.episode.size)
        self.outbox.append(item)
        self.outbox_bytes += item.size
        while len(self.outbox) > 1 and (
            len(self.outbox) > self.settings.outbox
            or self.outbox_bytes + self.book.bytes > self.settings.max_bytes
        ):
            gone = self.outbox.popleft()
            self.outbox_bytes -= gone.size
            self.counts.outbox_dropped += 1
            log.error(
                "capture: episode %s dropped unpublished (%d turns): the outbox is over its "
                "budget (%d episodes, %d bytes with the open ones); is NATS reachable?",
                gone.closed.episode.episode_id,
                len(gone.closed.episode.exchanges),
                len(self.outbox),
                self.outbox_bytes + self.book.bytes,
            )
        self.book.reserved = self.outbox_bytes
        self._wake.set()

    def _unqueue(self, item: Outgoing) -> None:
        with contextlib.suppress(ValueError):
            self.outbox.remove(item)
            self.outbox_bytes -= item.size
        self.book.reserved = self.outbox_bytes

    async def end(
        self, episode_id: str, body: EndRequest | None = None, owner: str | None = None
    ) -> dict[str, Any]:
        """Close episode `episode_id` (its session key or any of its completion ids) now and
        publish it. Returns what was ended; raises `LookupError` with the truth when there
        is no such open episode."""
        key = self.book.find(episode_id, owner)
        if key is None:
            raise LookupError(self._why_not_open(episode_id, owner))
        ep = self.book.end(key)
        assert ep is not None
        b = body or EndRequest()
        closed, outcome = Closed(ep, "ended"), outcome_of(b.success, b.score)
        event = self.trajectory(closed, outcome, b.notes())
        out = self._summary(ep, event)
        if event is not None:
            try:
                await self.publish_many([event])
            except Exception:
                self._queue(closed, outcome, b.notes())  # `run` retries it
                raise
        return out

    def _why_not_open(self, episode_id: str, owner: str | None) -> str:
        gone = self.book.what_became(episode_id, owner)
        if gone is None:
            scope = " for this API key" if owner else ""
            return (
                f"no episode {episode_id!r} was seen{scope}: its requests carried no session key "
                "(header x-agentrl-session, x-episode-id or x-session-id, body episode_id or "
                "metadata.session_id) and it names none of their completion ids (an episode "
                "that only OpenAI's `user` named is named by its first completion id)"
            )
        why = {
            "ended": "it was ended already",
            "idle": f"it was closed by the idle timeout ({self.settings.idle_timeout_s:g} s, "
            "AGENTRL_CAPTURE_IDLE_TIMEOUT_S)",
            "memory": "it was closed early to keep capture within its memory budget",
            "shutdown": "the gateway stopped",
        }.get(gone["closed_by"], gone["closed_by"])
        failed = f", {gone['failed_turns']} of them failed" if gone.get("failed_turns") else ""
        return (
            f"episode {episode_id!r} is not open: {why}, with {gone['turns']} turns{failed}; "
            f"published as trajectory {gone['trajectory_id']}"
        )

    @staticmethod
    def _summary(ep: OpenEpisode, event: TrajectoryEvent | None) -> dict[str, Any]:
        return {
            "episode_id": ep.episode_id,
            "trajectory_id": event.trajectory_id if event else None,
            "turns": len(ep.exchanges),
            "threads": len(ep.threads),
            "failed_turns": ep.failed,
            "serving_versions": (event.metadata.model_extra or {}).get("serving_versions")
            if event
            else [],
            "published": event is not None,
        }

    def trajectory(
        self, closed: Closed, outcome: Any, notes: dict[str, str] | None = None
    ) -> TrajectoryEvent | None:
        event = to_trajectory(
            closed.episode,
            ended_at=utcnow(),
            reason=closed.reason,
            outcome=outcome,
            notes=notes,
        )
        if event is None:
            self.counts.empty += 1
        return event

    async def publish(self, event: TrajectoryEvent) -> None:
        """Redact, publish (Msg-Id = trajectory id) and index one trajectory."""
        await self.publish_many([event])

    async def publish_many(self, events: list[TrajectoryEvent]) -> None:
        """Redact, publish (pipelined, Msg-Id = trajectory id) and index trajectories. One
        over the server's max_payload is trimmed or dead-lettered, never retried."""
        from agentrl.core.errors import PayloadTooLargeError
        from agentrl.rewards.redact import redact_event

        cleaned = []
        for event in events:
            clean, found = redact_event(event)
            self.counts.redacted += bool(found)
            cleaned.append(clean)
        # indexed before they are published: feedback sent as soon as a trajectory (or its
        # reward) is seen finds it by completion or episode id
        try:
            index = await self._index_open()
            await asyncio.gather(*(self._index(index, c) for c in cleaned))
        except Exception:  # feedback by trajectory id still works
            log.warning("capture: could not index %d trajectories", len(cleaned), exc_info=True)
        try:
            await self.bus.publish_many(cleaned)
        except PayloadTooLargeError:
            cleaned = await self._fitted(cleaned)
            if cleaned:
                await self.bus.publish_many(cleaned)
        self.counts.published += len(cleaned)

    async def _fitted(self, events: list[TrajectoryEvent]) -> list[TrajectoryEvent]:
        """Each event as it can be published: itself, trimmed to fit, or (dead-lettered) none."""
        limit = int(getattr(getattr(self.bus, "nc", None), "max_payload", 0) or 0)
        out = []
        for e in events:
            data = e.to_json()
            if not limit or len(data) <= limit:
                out.append(e)
                continue
            small = fit(e, limit)
            if small is not None:
                self.counts.trimmed += 1
                log.warning(
                    "capture: trajectory %s was %d bytes, over max_payload %d: long texts cut",
                    e.trajectory_id,
                    len(data),
                    limit,
                )
                out.append(small)
                continue
            await self.dead_letter(
                e,
                "payload_too_large",
                f"trajectory is {len(data):,} bytes, over the server's max_payload of "
                f"{limit:,} even with every text cut; raise max_payload or AGENTRL_CAPTURE_"
                "MAX_TURNS",
                data,
            )
        return out

    async def dead_letter(
        self, event: TrajectoryEvent | None, kind: str, reason: str, data: bytes = b""
    ) -> None:
        """RL_DLQ: what could not be published, with why (an excerpt: it is too big)."""
        from agentrl.bus.deadletter import EXCERPT_BYTES
        from agentrl.contracts.streams import DLQ_PREFIX

        self.counts.dead_lettered += 1
        capture = ((event.metadata.model_extra or {}).get("capture") or {}) if event else {}
        record = {
            "original_subject": TrajectoryEvent.SUBJECT,
            "stream": None,
            "consumer": "capture",
            "error_kind": kind,
            "error": reason[:8192],
            "dead_lettered_at": utcnow().isoformat(),
            "trajectory_id": event.trajectory_id if event else None,
            "episode_id": capture.get("episode_id"),
            "turns": len(event.turns) if event else None,
            "data_bytes": len(data),
            "data_excerpt": data[:EXCERPT_BYTES].decode("utf-8", errors="replace"),
            "data_truncated": True,
        }
        mid = f"dlq:capture:{event.trajectory_id if event else time.time_ns()}"
        log.error("capture: dead-lettered %s: %s", record["trajectory_id"], reason)
        await self.bus.publish_raw(
            f"{DLQ_PREFIX}.{TrajectoryEvent.SUBJECT}", json.dumps(record).encode(), mid
        )

    async def _index_open(self) -> TrajectoryIndex:
        if self.index is None:
            s = self.settings
            self.index = await TrajectoryIndex.open(self.bus.js, s.index_bucket, s.index_ttl_s)
        return self.index

    @staticmethod
    async def _index(index: TrajectoryIndex, event: TrajectoryEvent) -> None:
        capture = (event.metadata.model_extra or {}).get("capture") or {}
        episodes = sorted({str(capture.get("episode_id") or ""), event.session_id} - {""})
        cids = list(capture.get("completion_ids") or [])
        # the gateway's completions were indexed as they were served; written again here
        # (idempotent) so a write that lost its race or failed cannot hide a published one
        await index.put_completions([(c, event.trajectory_id) for c in cids])
        for episode in episodes:
            await index.add_episode(episode, event.trajectory_id)

    async def write_index(self) -> None:
        """The completions served since the last call -> their trajectory ids (so feedback
        and OTLP traces can name them before the episode ends)."""
        if not (self.to_index or self.calls_to_index):
            return
        pairs, self.to_index = self.to_index, []
        calls, self.calls_to_index = self.calls_to_index, []
        try:
            index = await self._index_open()
            await asyncio.gather(index.put_completions(pairs), index.put_pairs(CALL, calls))
        except Exception:
            self.to_index = pairs + self.to_index  # tried again next tick
            self.calls_to_index = calls + self.calls_to_index
            raise

    async def flush(self, batch: int = 256) -> None:
        """Publish everything closed so far, in batches (a transient failure leaves it
        queued and raises; a permanent one never stays at the head)."""
        while self.outbox:
            items = [self.outbox[i] for i in range(min(batch, len(self.outbox)))]
            events = []
            for it in items:
                try:
                    event = self.trajectory(it.closed, it.outcome, it.notes)
                except Exception as exc:  # a bug or a contract violation: not retried
                    log.exception("capture: episode %s cannot be built", it.closed.episode.key)
                    await self.dead_letter(None, "invalid", f"{type(exc).__name__}: {exc}")
                    event = None
                if event is not None:
                    events.append(event)
            if events:
                await self.publish_many(events)
            for it in items:  # by identity: the outbox may have moved meanwhile
                self._unqueue(it)

    async def run(self, stop: asyncio.Event, tick_s: float = 1.0) -> None:
        """Close idle episodes and publish closed ones until `stop`; then close the rest.
        Meanwhile answer enrichments sent by OTLP receivers in other processes."""
        sub = await self._subscribe()
        try:
            await self._run(stop, tick_s)
        finally:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _run(self, stop: asyncio.Event, tick_s: float) -> None:
        while not stop.is_set():
            for c in self.book.expire(time.monotonic(), self.settings.idle_timeout_s):
                self._queue(c, None, {})
            try:
                await self.write_index()
                await self.flush()
            except Exception:
                self.counts.publish_failed += 1
                log.warning("capture: publishing failed; will retry", exc_info=True)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), tick_s)
        for c in self.book.close_all():
            self._queue(c, None, {})
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.write_index(), 10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), 10)

    def router(self, state: Any = None) -> APIRouter:
        """The gateway's episode routes (the gateway mounts them when capture is on)."""
        if state is not None:
            self.keyed = lambda: bool(getattr(state, "api_keys", None))
        return gateway_router(self)

    def stats(self) -> dict[str, Any]:
        return {
            "open": len(self.book.open),
            "open_bytes": self.book.bytes,
            "outbox": len(self.outbox),
            "outbox_bytes": self.outbox_bytes,
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
        owner = owner_of(request.headers) if service.keyed() else None
        try:
            return await service.end(episode_id, body, owner)
        except LookupError as exc:
            return JSONResponse({"error": {"message": str(exc.args[0])}}, 404)
        except Exception as exc:
            log.warning("capture: could not publish episode %s", episode_id, exc_info=True)
            return JSONResponse(
                {"error": {"message": f"episode closed but not published yet: {exc}"}}, 503
            )

    @router.get("/v1/episodes/stats")
    async def stats() -> dict[str, Any]:
        return service.stats()

    return router
