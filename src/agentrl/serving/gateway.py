"""The OpenAI-compatible gateway: `POST /v1/chat/completions` (streaming or not, tools,
log-probs, vLLM's `guided_choice`) and `GET /v1/models`, routed over the registered
versions by a sticky weighted split.

The public name (default "agentrl-policy") is split across versions by the registry's
weights; a session keeps its version (key: header `x-agentrl-session`, TensorZero's
`episode_id` as header `x-episode-id` or body field, else the OpenAI `user` field, else
`metadata.session_id`); with capture on, those requests also form episodes (`agentrl.capture`,
called after the answer is made, never raising). Asking
for a version's own model_id pins it. Every answer names the version that served it
(`model` and the `x-agentrl-model-version` header). Per-version counters (requests,
errors, latencies) live in `GatewayState.stats` for the monitor and the metrics exporter.

Those counters are the canary's evidence, so only what the split routed counts there, and
only failures of the backend itself (5xx of the engine or upstream, timeouts) are errors:
an input problem (bad schema, too deep, too large, context overflow) is a 400 that counts
nowhere and is logged as one short line, and a request that names a version by its id
(pinned) is counted apart, in `GatewayState.pinned` (any caller can pin: counting those
let a caller roll back a good canary, or hide a bad one behind inflated live errors).
A constraint (response_format, tools, guided_*) is bounded before any work and, for the
local engine, built and compiled here, off the event loop, under the compile slots of
`agentrl.serving.structured`, the caller named by its key's digest or address.
The completion log (token ids + log-probs per completion id) goes to a queue that a
background task publishes: never on the request's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import os
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from agentrl.observability import instrument as obs
from agentrl.serving import split as splitting
from agentrl.serving import structured
from agentrl.serving.backends import Backend, _accumulate
from agentrl.serving.errors import BackendError, DeployError, VersionNotServed
from agentrl.serving.openai_types import (
    ChatRequest,
    Generation,
    chunk,
    completion_body,
    error_body,
    logprobs_block,
    new_completion_id,
)
from agentrl.serving.registry import lineage_of_version
from agentrl.serving.structured import ToolCallStream, tool_call_deltas

log = logging.getLogger(__name__)

VERSION_HEADER = "x-agentrl-model-version"
COMPLETION_HEADER = "x-agentrl-completion-id"  # the key of the completion log, at stream start
SESSION_HEADERS = ("x-agentrl-session", "x-episode-id", "x-session-id")
AGENT_HEADER = "x-agentrl-agent"  # the agent id (capture's too): picks its lineage
PROFILE_HEADER = "x-agentrl-profile"  # an Agent Zero profile: picks its lineage


@dataclass
class VersionStats:
    """Counters of one version (cumulative; the monitor takes differences)."""

    requests: int = 0
    errors: int = 0
    timeouts: int = 0
    completion_tokens: int = 0
    latency_ms: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    first_error_at: float | None = None  # time.time() of the first error (benchmarks)

    def snapshot(self) -> dict[str, Any]:
        lat = sorted(self.latency_ms)
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None  # noqa: E731
        return {
            "requests": self.requests,
            "errors": self.errors,
            "timeouts": self.timeouts,
            "completion_tokens": self.completion_tokens,
            "latency_p50_ms": p(0.5),
            "latency_p99_ms": p(0.99),
        }


class CompletionLog:
    """A bounded queue of completion records and the task that publishes them in batches.

    When the bus cannot keep up (or NATS is away) the oldest records are dropped (and
    counted) rather than slowing requests down: the queue is bounded by records and by
    estimated bytes (`max_bytes`; a record of an agent's long prompt holds ~40 bytes per
    token id as Python ints), never unbounded. An item is a `CompletionRecord` or, from the
    gateway's request path, its wire form `(subject, JSON, msg id)` (`completion_wire`)."""

    def __init__(
        self,
        bus: Any,
        maxsize: int = 20_000,
        batch: int = 512,
        linger_s: float = 0.1,
        max_bytes: int = 64 * 2**20,
    ) -> None:
        self.bus = bus
        self.linger_s = linger_s  # gather records this long: one publish per many requests
        self.queue: deque[Any] = deque()
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.bytes = 0
        self.batch = batch
        self.published = 0
        self.dropped = 0
        self.failed = 0
        self._wake = asyncio.Event()

    @staticmethod
    def record_bytes(record: Any) -> int:
        if isinstance(record, tuple):  # (subject, JSON bytes, msg id): what it holds
            return 256 + len(record[1])
        n = sum(
            len(getattr(record, f, None) or ())
            for f in ("prompt_token_ids", "completion_token_ids", "completion_logprobs")
        )
        return 512 + 40 * n

    def submit(self, record: Any) -> None:
        self.queue.append(record)
        self.bytes += self.record_bytes(record)
        while len(self.queue) > 1 and (
            len(self.queue) > self.maxsize or self.bytes > self.max_bytes
        ):
            self.bytes -= self.record_bytes(self.queue.popleft())
            self.dropped += 1
        self._wake.set()

    def _take(self, n: int) -> list[Any]:
        items = [self.queue.popleft() for _ in range(min(n, len(self.queue)))]
        self.bytes -= sum(self.record_bytes(r) for r in items)
        return items

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set() or self.queue:
            if not self.queue:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.5)
                continue
            if len(self.queue) < self.batch and not stop.is_set():
                await asyncio.sleep(self.linger_s)
            items = self._take(self.batch)
            try:
                await self.bus.publish_many(items)
                self.published += len(items)
            except Exception:  # never let the log take the gateway down
                self.failed += len(items)
                log.warning(
                    "completion log: could not publish %d records", len(items), exc_info=True
                )
                await asyncio.sleep(0.5)


_NO_ROUTE: tuple[dict[str, float], list[str]] = ({}, [])


class GatewayState:
    """What the gateway routes by; the manager (`agentrl.release.serving_manager`) keeps it current."""

    def __init__(
        self,
        public_name: str = "agentrl-policy",
        *,
        api_keys: list[str] | None = None,
        completion_log: CompletionLog | None = None,
        timeout_s: float = 60.0,
        capture: Any = None,
    ) -> None:
        self.public_name = public_name
        self.capture = capture  # agentrl.capture.service.CaptureService: episodes (optional)
        self.weights: dict[str, float] = {}
        self.order: list[str] = []
        self.backends: dict[str, Backend] = {}
        self.stats: dict[str, VersionStats] = {}  # split-routed requests: the evidence
        self.pinned: dict[str, VersionStats] = {}  # requests naming a version by its id
        self.refused = 0  # input problems answered 4xx (never counted as a version's)
        self.api_keys = list(api_keys or [])
        self.completion_log = completion_log
        self.timeout_s = timeout_s
        self.unanswered = 0  # requests that got no HTTP answer at all (should stay 0)
        # Admission: at most `max_inflight` chat requests at once; beyond that a 429 with
        # Retry-After (queueing without bound grew memory and latency for everyone).
        self.max_inflight = 64
        self.inflight = 0
        self.shed = 0  # requests answered 429 because the gateway was full
        self.abandoned = 0  # requests whose client went away before the answer (cancelled)
        self.rng = random.Random()
        # Lineages (`agentrl.release.lineage`) other than the default `public_name`: each its
        # own split (weights, order); agent id / Agent Zero profile -> lineage (requests for
        # the default name from a mapped agent go to its lineage); retired names answer 404.
        self.routes: dict[str, tuple[dict[str, float], list[str]]] = {}
        self.by_agent: dict[str, str] = {}
        self.by_profile: dict[str, str] = {}
        self.retired: frozenset[str] = frozenset()
        # which gateway process this is (`agentrl.serving.gateway_workers`): worker 0 runs
        # the others (`workers`: their WorkerPool, for /v1/stats)
        self.worker = int(os.environ.get("AGENTRL_GATEWAY_WORKER") or 0)
        self.workers: Any = None
        self.fleet: Any = None  # every process's counters per version (the controller's view)

    def set_split(
        self, weights: dict[str, float], order: list[str], lineage: str | None = None
    ) -> None:
        """Replace a lineage's routing weights at once (only versions with a backend may get
        traffic); `lineage` None or the default name: the default lineage's split."""
        ready = {v: w for v, w in weights.items() if v in self.backends and w > 0}
        if not ready and weights:
            raise DeployError("no version of the split is ready to serve")
        ordered = [v for v in order if v in ready] + [v for v in ready if v not in order]
        if lineage is None or lineage == self.public_name:
            self.weights, self.order = ready, ordered
        else:
            self.routes[lineage] = (ready, ordered)

    def set_lineages(
        self,
        served: list[str],
        by_agent: dict[str, str],
        by_profile: dict[str, str],
        retired: set[str],
    ) -> None:
        """The lineages this gateway routes (their splits come with `set_split`)."""
        for gone in set(self.routes) - set(served):
            del self.routes[gone]
        for name in served:
            if name != self.public_name:
                self.routes.setdefault(name, ({}, []))
        self.by_agent, self.by_profile = dict(by_agent), dict(by_profile)
        self.retired = frozenset(retired)

    def split_of(self, lineage: str) -> dict[str, float]:
        """The weights a lineage routes by now."""
        if lineage == self.public_name:
            return self.weights
        return self.routes.get(lineage, ({}, []))[0]

    def stats_for(self, model_id: str, pinned: bool = False) -> VersionStats:
        table = self.pinned if pinned else self.stats
        s = table.get(model_id)
        if s is None:
            s = table[model_id] = VersionStats()
        return s

    def models(self) -> list[str]:
        """The lineages (the default first), then every prepared version."""
        return [self.public_name, *sorted(self.routes), *sorted(self.backends)]

    def context_of(self, name: str) -> int | None:
        """The context window (tokens) of a version, or the smallest of a lineage's live
        versions; None when a backend does not say (an upstream server)."""
        if name == self.public_name:
            names = list(self.weights or self.backends)
        elif name in self.routes:
            names = list(self.routes[name][0])
        else:
            names = [name]
        sizes = [
            getattr(getattr(self.backends.get(n), "engine", None), "context", None) for n in names
        ]
        known = [int(c) for c in sizes if isinstance(c, int)]
        return min(known) if known and len(known) == len(sizes) else None

    def lineage_for(self, name: str, agent: str | None, profile: str | None) -> str:
        """The lineage a request for `name` goes to: a request for the default name from an
        agent (or Agent Zero profile) mapped to a lineage goes there (dict lookups only)."""
        if name == self.public_name and (agent or profile):
            lineage = self.by_agent.get(agent or "") or self.by_profile.get(profile or "")
            # a lineage this gateway does not route yet (just created): the asked name
            if lineage and self.routes.get(lineage, _NO_ROUTE)[0]:
                return lineage
        return name

    def resolve(self, name: str, session: str | None) -> str:
        """The version that serves a request for `name` (a lineage: its sticky split, per
        lineage; a version id: itself). KeyError: no such model."""
        if name == self.public_name:
            if not self.weights:
                raise DeployError("no model version is serving yet")
            return splitting.choose(self.weights, self.order, session, self.public_name, self.rng)
        route = self.routes.get(name)
        if route is not None:
            if not route[0]:
                raise DeployError(f"no version of lineage {name!r} is serving yet")
            return splitting.choose(route[0], route[1], session, name, self.rng)
        if name in self.backends:
            if self.retired and self.retired_lineage(name):
                raise KeyError(name)  # a retired lineage's version (still loaded as a spare)
            return name
        raise KeyError(name)

    def retired_lineage(self, name: str) -> str | None:
        """The retired lineage `name` is, or whose version it is; else None."""
        if name in self.retired:
            return name
        lineage = lineage_of_version(name)
        return lineage if lineage in self.retired else None


_SESSION_KEYS = tuple(h.encode() for h in SESSION_HEADERS)


def _heads(scope: Any) -> dict[bytes, bytes]:
    """A request's headers by (lower-case) name, read once; the first of a repeated header,
    as Starlette's `Headers.get` answers. The chat path looks up five; Starlette's `Headers`
    decodes and scans the list for each (a tenth of the handler's own time, py-spy)."""
    out: dict[bytes, bytes] = {}
    for k, v in scope["headers"]:
        if k not in out:
            out[k] = v
    return out


_AGENT_KEY, _PROFILE_KEY = AGENT_HEADER.encode(), PROFILE_HEADER.encode()


def _text(heads: dict[bytes, bytes], key: bytes) -> str | None:
    value = heads.get(key)
    return value.decode("latin-1") if value is not None else None


def _session_key(heads: dict[bytes, bytes], body: ChatRequest) -> str | None:
    for h in _SESSION_KEYS:
        if value := heads.get(h):
            return value.decode("latin-1")
    meta = (body.model_extra or {}).get("metadata")
    meta_session = meta.get("session_id") if isinstance(meta, dict) else None
    return body.episode_id or body.user or (str(meta_session) if meta_session else None)


def _error(
    status: int,
    message: str,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(message, type_, code, param), status_code=status, headers=headers
    )


CHAT_PATH = "/v1/chat/completions"


class _GatewayApp(FastAPI):
    """FastAPI, except that `POST /v1/chat/completions` goes straight to its handler (through
    admission), past Starlette's middleware stack, router and dependency solving: at 1,000
    requests/s those cost more CPU than the gateway's own work (py-spy, `agentrl bench
    gateway`). The route stays declared (OpenAPI schema); everything else is plain FastAPI.
    An exception escaping the handler is the server's 500, as under ServerErrorMiddleware."""

    chat_fast: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            self.chat_fast is not None
            and scope["type"] == "http"
            and scope["path"] == CHAT_PATH
            and scope["method"] == "POST"
        ):
            scope["app"] = self
            await self.chat_fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


# Gateway routes that answer without a key: up/down only. Every other route (the capture
# router's too) needs one when keys are configured, checked app-wide (`require_key`);
# tests/app/test_route_auth.py walks every route to keep it so.
PUBLIC_PATHS = frozenset({"/health"})


class _Unauthorized(Exception):
    """No key, or not one of the gateway's (answered 401 in OpenAI's format)."""


def create_gateway_app(state: GatewayState) -> FastAPI:
    """The gateway's FastAPI app over `state`: the module's `router`, the key check on every
    route, admission, and the chat route's direct path (`_GatewayApp`)."""
    app = _GatewayApp(
        title="agentrl gateway",
        description="OpenAI-compatible chat completions.",
        version="1",
        dependencies=[Depends(require_key)],
    )
    app.state.gateway = state
    app.add_middleware(_Admission, state=state)
    app.add_exception_handler(_Unauthorized, _refuse)
    if state.capture is not None:  # POST /v1/episodes/{id}/end, GET /v1/episodes/stats
        app.include_router(state.capture.router(state))
    app.include_router(router)
    app.chat_fast = _Admission(ChatEndpoint(state), state)
    return app


def gateway_state(request: Request) -> GatewayState:
    """The state the app serving `request` routes by (`create_gateway_app` puts it there)."""
    return request.app.state.gateway  # type: ignore[no-any-return]


async def require_key(request: Request) -> None:
    """Every route but `PUBLIC_PATHS` needs one of the gateway's keys (when it has any)."""
    route = request.scope.get("route")
    if (
        getattr(route, "path", None) in PUBLIC_PATHS
        or unauthorized(gateway_state(request), request) is None
    ):
        return
    raise _Unauthorized()


async def _refuse(_request: Request, _exc: Exception) -> JSONResponse:
    return _error(
        401,
        "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
        "invalid_request_error",
        "invalid_api_key",
    )


def unauthorized(
    state: GatewayState, request: Request, heads: dict[bytes, bytes] | None = None
) -> JSONResponse | None:
    """None when the request may pass (no keys configured, or one of them as its bearer
    token), else the 401 to answer."""
    if not state.api_keys:
        return None
    if heads is None:
        auth = request.headers.get("authorization", "")
    else:
        auth = heads.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and any(
        hmac.compare_digest(token.encode(), k.encode()) for k in state.api_keys
    ):
        return None
    return _error(
        401,
        "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
        "invalid_request_error",
        "invalid_api_key",
    )


# The gateway's routes, apart from the app that serves them (as vLLM keeps its router apart
# from its serving class): each handler reads the `GatewayState` of the app it runs in.
router = APIRouter()


@router.get("/health", response_model=None)
async def health(request: Request) -> Any:
    state = gateway_state(request)
    if unauthorized(state, request) is not None:  # up/down only: the split is not public
        return {"status": "ok"}
    return {"status": "ok", "weights": state.weights}


@router.get("/v1/stats", response_model=None)
async def stats(request: Request) -> Any:
    state = gateway_state(request)
    if (denied := unauthorized(state, request)) is not None:
        return denied
    return {
        "weights": state.weights,
        "lineages": {name: route[0] for name, route in state.routes.items()},
        "versions": {k: v.snapshot() for k, v in state.stats.items()},
        "pinned": {k: v.snapshot() for k, v in state.pinned.items()},
        "refused": state.refused,
        "compiles": {  # structured-output compiles in flight, and requests turned away
            "busy": structured.SLOTS.busy,
            "refused": structured.SLOTS.refused,
        },
        "completion_log": None
        if state.completion_log is None
        else {
            "published": state.completion_log.published,
            "dropped": state.completion_log.dropped,
            "queued": len(state.completion_log.queue),
            "queued_bytes": state.completion_log.bytes,
        },
        "admission": {
            "inflight": state.inflight,
            "max_inflight": state.max_inflight,
            "shed": state.shed,
            "abandoned": state.abandoned,
        },
        # the process that answered (with several on the port, each counts its own; the
        # controller and /metrics see them all)
        "process": {"worker": state.worker, "pid": os.getpid()}
        | ({"workers": state.workers.status()} if state.workers is not None else {})
        | (
            {
                "fleet": {
                    m: {"requests": s.requests, "errors": s.errors} for m, s in state.fleet.items()
                }
            }
            if state.fleet is not None
            else {}
        ),
    }


@router.get("/v1/models", response_model=None)
async def models(request: Request) -> Any:
    state = gateway_state(request)
    if (denied := unauthorized(state, request)) is not None:
        return denied
    now = int(time.time())
    return {
        "object": "list",
        "data": [  # max_model_len as vLLM names it (clients size their history by it)
            {"id": m, "object": "model", "created": now, "owned_by": "agentrl"}
            | ({"max_model_len": c} if (c := state.context_of(m)) else {})
            for m in state.models()
        ],
    }


@router.post(CHAT_PATH, response_model=None)
async def chat(request: Request) -> Any:
    """Declared for the OpenAPI schema and any app that mounts `router` alone; the gateway's
    own app answers this path by `ChatEndpoint` (`_GatewayApp`)."""
    return await serve_chat(gateway_state(request), request)


class ChatEndpoint:
    """`POST /v1/chat/completions` as a bare ASGI app over one `GatewayState`."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        response = await serve_chat(self.state, Request(scope, receive))
        await response(scope, receive, send)


async def serve_chat(state: GatewayState, request: Request) -> Response:
    """One chat completion: key, body, routing, the backend's answer (or stream), the
    counters, the completion log and capture."""
    heads = _heads(request.scope)
    if (denied := unauthorized(state, request, heads)) is not None:
        return denied
    try:
        body = ChatRequest.model_validate(orjson.loads(await _request_body(request)))
    except (ValueError, ValidationError) as exc:
        msg = (
            str(exc)
            if not isinstance(exc, ValidationError)
            else "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
            )
        )
        return _error(400, f"invalid request: {msg}", "invalid_request_error")
    session = _session_key(heads, body)
    capture = state.capture
    tracked = capture is not None and capture.wants(request.headers, body)
    name = body.model
    if state.by_agent or state.by_profile:  # agents mapped to lineages
        name = state.lineage_for(name, _text(heads, _AGENT_KEY), _text(heads, _PROFILE_KEY))
    try:
        model_id = state.resolve(name, session)
    except KeyError:
        if retired := state.retired_lineage(name):
            what = (
                f"The lineage '{name}' is retired"
                if retired == name
                else f"The model version '{name}' belongs to the retired lineage '{retired}'"
            )
            return _error(
                404,
                f"{what}. Available models: {', '.join(state.models())}",
                "invalid_request_error",
                "model_not_found",
                "model",
            )
        return _error(
            404,
            f"The model '{body.model}' does not exist. Available models: "
            f"{', '.join(state.models())}",
            "invalid_request_error",
            "model_not_found",
            "model",
        )
    except DeployError as exc:
        return _error(503, str(exc), "service_unavailable")
    backend = state.backends[model_id]
    # a request naming a version by its id is pinned; one routed by a split is evidence
    stats = state.stats_for(model_id, pinned=model_id == body.model)
    completion_id = new_completion_id()
    headers = {VERSION_HEADER: model_id, COMPLETION_HEADER: completion_id}
    stats.requests += 1
    obs.gateway_started(model_id)
    started = time.perf_counter()
    structured.CALLER.set(_caller(heads, request.scope.get("client")))
    try:
        await _prepare(backend, body)
    except Exception as exc:  # StructuredOutputError: 400 / 429, uncounted
        return _failed(state, stats, exc, model_id, headers)
    if body.stream:
        return await _stream(
            state,
            backend,
            model_id,
            body,
            completion_id,
            session,
            headers,
            started,
            request.headers if tracked else None,
            stats,
        )
    work = backend.generate(model_id, body)
    if (getattr(backend, "deadline_s", None) or float("inf")) > state.timeout_s:
        work = _within(work, state.timeout_s)  # (else the backend's own deadline comes first)
    try:
        gen = await _unless_gone(request, work)
    except _ClientGone:
        state.abandoned += 1
        if tracked:  # a failed turn of its episode, with why
            capture.failed(request.headers, body, 499, CLIENT_GONE, completion_id, model_id)
        return Response(status_code=499, headers=headers)
    except (TimeoutError, BackendError, DeployError, Exception) as exc:
        failure = _failed(state, stats, exc, model_id, headers)
        if tracked:  # a failed turn of its episode, never a lost episode
            _capture_failed(capture, request.headers, body, failure, completion_id, model_id)
        return failure
    stats.latency_ms.append((time.perf_counter() - started) * 1000)
    obs.gateway_done(model_id, time.perf_counter() - started)
    stats.completion_tokens += gen.completion_tokens
    if gen.raw is not None:
        out = dict(gen.raw)
        out["id"], out["model"] = completion_id, model_id
    else:
        out = completion_body(gen, completion_id, model_id, body)
    _log(state, completion_id, model_id, session, gen)
    if tracked:
        capture.observe(request.headers, body, gen, completion_id, model_id)
    elif capture is not None:
        capture.served(completion_id)
    return _JSONAnswer(orjson.dumps(out), headers)


CLIENT_GONE = "the client disconnected before the answer was ready"


class _JSONAnswer(Response):
    """A 200 JSON answer with its headers built directly (Starlette's `init_headers` lower-
    cases, encodes and scans them per response): the chat path's non-streamed success."""

    def __init__(self, body: bytes, headers: dict[str, str]) -> None:
        self.status_code, self.body, self.background = 200, body, None
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def _caller(heads: dict[bytes, bytes], client: Any) -> str:
    """Who asks, for the per-caller compile bound: the digest of its key, else its address
    (`client`: the ASGI scope's (host, port) or None)."""
    scheme, _, token = heads.get(b"authorization", b"").decode("latin-1").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "key:" + hashlib.sha256(token.strip().encode()).hexdigest()[:16]
    return f"addr:{client[0] if client else '-'}"


async def _prepare(backend: Backend, body: ChatRequest) -> None:
    """The request's constraint checked before the backend sees it: bounded for every
    backend (an upstream too), and for the local engine built in the constraint thread and
    compiled in the grammar pool (the engine then finds both cached), so a bad or costly
    schema is a 400/429 here, never the version's failure and never on the event loop."""
    fields = structured.constraint_fields(body)
    if not fields:
        return
    structured.check_bounds(fields)
    grammars = getattr(getattr(backend, "engine", None), "grammars", None)
    if grammars is None or body.choices():
        return
    try:
        async with asyncio.timeout(structured.COMPILE_TIMEOUT_S):
            constraint = await structured.constraint_off_loop(body)
    except TimeoutError as exc:
        raise structured.CompileBusy("the gateway is busy building constraints; retry") from exc
    if constraint is not None:
        await grammars.template(constraint)


async def _request_body(request: Request) -> bytes:
    """The request's body, read from `receive` as Starlette's `Request.body` does (and kept
    there for any later reader), without its async generator: a few per cent of the gateway's
    CPU per request at 1,000 requests/s (py-spy)."""
    parts: list[bytes] = []
    while True:
        message = await request.receive()
        if message["type"] != "http.request":  # http.disconnect: the client is gone
            raise ClientDisconnect()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    raw = parts[0] if len(parts) == 1 else b"".join(parts)
    request._body = raw  # (Starlette's cache: `await request.body()` answers it)
    request._stream_consumed = True
    return raw


async def _within(work: Any, seconds: float) -> Any:
    """`work` or TimeoutError after `seconds` (asyncio.timeout: no extra task, unlike
    wait_for, on the per-request path)."""
    async with asyncio.timeout(seconds):
        return await work


async def _unless_gone(request: Request, work: Any) -> Any:
    """Await `work`, cancelling it (and so its decode) when the client disconnects. The work
    runs in the request's own task, which a watcher cancels (a task for the work as well
    cost a task per request)."""
    task = asyncio.current_task()
    assert task is not None
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            raise _ClientGone() from None
        raise
    finally:
        watcher.cancel()


class _Admission:
    """ASGI middleware: counts chat requests in flight until their last byte is sent (a
    stream too) and sheds those beyond `state.max_inflight` with 429 + Retry-After."""

    def __init__(self, app: Any, state: GatewayState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        state = self.state
        if state.inflight >= state.max_inflight:
            state.shed += 1
            await _error(
                429,
                f"the gateway is at capacity ({state.max_inflight} requests in flight); "
                "retry after a moment",
                "rate_limit_exceeded",
                "overloaded",
                headers={"retry-after": "1"},
            )(scope, receive, send)
            return
        state.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            state.inflight -= 1


class _ClosingStream(Response):
    """A stream that closes its source however it ends: a client that disconnects (or
    times out) mid-stream cancels the generation instead of decoding to max_tokens, and
    `on_cancel` logs what the client was sent (the completion id named at stream start
    keeps its row in the completion log).

    Sent by hand rather than by Starlette's `StreamingResponse`, whose anyio task group (two
    tasks and a cancel scope per stream, for an ASGI 2.3 server such as uvicorn) was a sixth
    of a streamed request's CPU (py-spy, `agentrl bench gateway --peers` streaming): one
    asyncio task waits for the client's disconnect and cancels the sending task. The piece
    sent while `last` is set ends the body in the same write (uvicorn sends a body's last
    data with its terminating chunk)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        source: Any,
        state: GatewayState,
        on_cancel: Any,
        headers: dict[str, str],
    ) -> None:
        self.status_code, self.background = 200, None
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]
        self.body_iterator = content
        self.source, self.gateway, self.on_cancel = source, state, on_cancel
        self.last = False  # the next piece is the body's last
        self.finished = False  # the whole stream was sent

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            ended = False
            async for piece in self.body_iterator:
                ended = self.last
                await send({"type": "http.response.body", "body": piece, "more_body": not ended})
            if not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone or task.uncancel() > 0:  # cancelled from outside: not ours to keep
                raise
        except OSError:  # an ASGI 2.4 server's send to a client that is gone
            pass
        finally:
            watcher.cancel()
            if not self.finished:
                self.gateway.abandoned += 1
            with contextlib.suppress(BaseException):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            with contextlib.suppress(BaseException):
                await self.source.aclose()
            if not self.finished:
                try:
                    self.on_cancel()
                except Exception:
                    log.exception("a cancelled stream's completion was not logged")


def classify(exc: BaseException, model_id: str) -> tuple[int, str]:
    """(HTTP status, message) of a failed request: >= 500 only for failures of the backend
    itself (its 5xx, a timeout, an exception of its own); every input problem < 500."""
    if isinstance(exc, TimeoutError):
        return 504, f"model version {model_id} did not answer in time"
    if isinstance(exc, BackendError):
        return exc.status, f"model version {model_id} failed: {exc}"
    if isinstance(exc, DeployError):  # StructuredOutputError (400, CompileBusy 429), ...
        status = getattr(exc, "status", 400)
        return (status if isinstance(status, int) and status < 500 else 400), str(exc)
    if isinstance(exc, RecursionError):  # nesting the bounds missed: still the input's
        return 400, "the request is nested too deeply"
    return 502, f"model version {model_id} failed: {type(exc).__name__}: {exc}"


_QUIET = {"at": 0.0, "since": 0}  # refusals logged at most once per REFUSAL_LOG_S


REFUSAL_LOG_S = 10.0


def _note_refusal(state: GatewayState, model_id: str, status: int, msg: str) -> None:
    """One short line (no traceback) per REFUSAL_LOG_S for input problems, however many."""
    state.refused += 1
    now = time.monotonic()
    if now - _QUIET["at"] < REFUSAL_LOG_S:
        _QUIET["since"] += 1
        return
    more = f" (and {_QUIET['since']} more since the last such line)" if _QUIET["since"] else ""
    _QUIET["at"], _QUIET["since"] = now, 0
    log.info("refused a request for %s (%d): %s%s", model_id, status, msg[:200], more)


def _failed(
    state: GatewayState,
    stats: VersionStats,
    exc: BaseException,
    model_id: str,
    headers: dict[str, str],
) -> JSONResponse:
    status, msg = classify(exc, model_id)
    if status >= 500:
        if status == 504:
            stats.timeouts += 1
        if status == 504 or isinstance(exc, BackendError):  # said in one line, always
            log.warning("backend of %s answered %d: %s", model_id, status, msg)
        else:
            log.error("backend of %s raised", model_id, exc_info=exc)
        stats.errors += 1
        obs.gateway_error(model_id)
        if stats.first_error_at is None:
            stats.first_error_at = time.time()
    else:  # not the version's request at all: neither a request nor an error of it
        stats.requests = max(0, stats.requests - 1)
        _note_refusal(state, model_id, status, msg)
    if status == 429:
        return _error(
            429, msg, "rate_limit_exceeded", "busy", headers={**headers, "retry-after": "1"}
        )
    if isinstance(exc, VersionNotServed):  # resolved, then gone: say what is served now
        served = ", ".join(m for m in state.models() if m != model_id)
        msg = f"{msg}. Available models: {served}"
        return _error(404, msg, "invalid_request_error", exc.code, "model", headers=headers)
    type_ = "server_error" if status >= 500 else "invalid_request_error"
    return _error(
        status, msg, type_, "upstream_timeout" if status == 504 else None, headers=headers
    )


def _capture_failed(
    capture: Any,
    headers: Any,
    body: ChatRequest,
    failure: JSONResponse,
    completion_id: str,
    model_id: str,
) -> None:
    """Hand a failed request to capture (its episode records a failed turn)."""
    try:
        message = json.loads(bytes(failure.body))["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = "no answer"
    capture.failed(headers, body, failure.status_code, message, completion_id, model_id)


COMPLETION_SUBJECT = "agent.rl.completion.v1"  # CompletionRecord.SUBJECT


@functools.cache
def _token_check() -> Any:
    """Validates a completion's token ids (strict ints) and log-probs (finite floats) at once,
    as `CompletionRecord` would (pydantic's validator, built once)."""
    from typing import Annotated

    from pydantic import ConfigDict, Field, StrictInt, TypeAdapter

    finite = Annotated[float, Field(allow_inf_nan=False)]
    return TypeAdapter(
        tuple[list[StrictInt], list[StrictInt], list[finite]],  # type: ignore[valid-type]
        config=ConfigDict(strict=True),
    )


def completion_wire(
    completion_id: str, model_id: str, session: str | None, gen: Generation
) -> tuple[str, bytes, str]:
    """The completion log's message for `gen`: (subject, JSON, Nats-Msg-Id), the bytes that
    `CompletionRecord(...).to_json()` makes (tests/serving/test_gateway_hotpath.py holds them
    equal). Built per request, so without the model: constructing and validating a
    CompletionRecord was the costliest step of the gateway's own work per request. Raises
    ValueError for what the record would refuse (non-integer ids, NaN or +inf log-probs)."""
    lps = [max(x, -1e30) for x in gen.token_logprobs]  # -inf (masked) -> finite
    try:
        _token_check().validate_python((gen.prompt_token_ids, gen.completion_token_ids, lps))
    except ValidationError as exc:
        raise ValueError(str(exc)) from None
    doc: dict[str, Any] = {"completion_id": completion_id, "model": model_id}
    if session is not None:
        doc["session_id"] = session
    doc["prompt_token_ids"] = gen.prompt_token_ids
    doc["completion_token_ids"] = gen.completion_token_ids
    doc["completion_logprobs"] = lps
    doc["constrained"] = bool(gen.constrained)
    if gen.schema_hash is not None:
        doc["schema_hash"] = gen.schema_hash
    if gen.finish_reason is not None:
        doc["finish_reason"] = gen.finish_reason
    doc["timestamp"] = datetime.now(UTC)
    return COMPLETION_SUBJECT, orjson.dumps(doc, option=orjson.OPT_UTC_Z), completion_id


def _log(
    state: GatewayState, completion_id: str, model_id: str, session: str | None, gen: Generation
) -> None:
    if state.completion_log is None:
        return
    try:
        message = completion_wire(completion_id, model_id, session, gen)
    except (ValueError, TypeError):  # TypeError: what orjson cannot encode
        log.warning("completion %s not logged: invalid record", completion_id)
        return
    state.completion_log.submit(message)


def _sse(obj: Any) -> bytes:
    """One server-sent event (orjson: per streamed token, the stdlib's encoder cost several
    times as much). A value orjson refuses (an upstream's odd chunk) goes through the stdlib's."""
    try:
        return b"data: " + orjson.dumps(obj) + b"\n\n"
    except TypeError:
        return b"data: " + json.dumps(obj, default=str).encode() + b"\n\n"


async def _stream(
    state: GatewayState,
    backend: Backend,
    model_id: str,
    body: ChatRequest,
    completion_id: str,
    session: str | None,
    headers: dict[str, str],
    started: float,
    tracked: Any = None,
    stats: VersionStats | None = None,
) -> Response:
    """A streamed answer: the backend's first item decides the status (a failing backend
    still gets a 502/504), then `_StreamRun` turns the items into server-sent events."""
    stats = stats or state.stats_for(model_id)
    source = backend.stream(model_id, body).__aiter__()
    try:
        first = await _next_item(source, state.timeout_s)
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            raise
        failure = _failed(state, stats, exc, model_id, headers)
        if tracked is not None and state.capture is not None:
            _capture_failed(state.capture, tracked, body, failure, completion_id, model_id)
        return failure
    run = _StreamRun(
        state, backend, model_id, body, completion_id, session, started, tracked, stats
    )
    run.response = _ClosingStream(run.events(first, source), source, state, run.cancelled, headers)
    return run.response


async def _next_item(source: AsyncIterator[tuple[str, Any]], timeout_s: float) -> Any:
    """The backend's next item, None at its end; a stalled backend is a TimeoutError
    (asyncio.timeout: no task, unlike wait_for)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await source.__anext__()
    except StopAsyncIteration:
        return None


@dataclass(eq=False)
class _StreamRun:
    """One streamed answer after its first item: the events sent, what the client was sent
    (for the log row of a stream it closes early), and the completion's accounting.

    Items: ("token", (id, log-prob, tops)) from the local engine, ("chunks", [...]) from an
    upstream (passed through under our id and version), ("done", Generation) at the end.
    A guided_choice streams as it decodes (the local engine decodes a streamed choice token
    by token; an upstream sends its own chunks); a tools answer (with its tool_choice not
    "none") or one with stop strings is buffered to its end, unless its calls stream live."""

    state: GatewayState
    backend: Backend
    model_id: str
    body: ChatRequest
    completion_id: str
    session: str | None
    started: float
    tracked: Any  # the request's headers when capture tracks it, else None
    stats: VersionStats
    # what the client was sent: the tokens whose text went out (a chunk counts once its
    # send returned), or the upstream's chunks. A buffered or tool-call answer sends no
    # token's text as such before its end: a row without completion tokens (training
    # falls back to the turn's text)
    got_ids: list[int] = field(default_factory=list)
    got_lps: list[float] = field(default_factory=list)
    shown: int = 0
    sent_chunks: list[dict[str, Any]] = field(default_factory=list)  # summed on cancel
    ids: list[int] = field(default_factory=list)  # the decoded tokens (eos left out)
    sent: str = ""  # the text sent so far
    logged: bool = False
    response: _ClosingStream | None = None

    def __post_init__(self) -> None:
        body = self.body
        self.buffered = bool(body.tools and body.tool_choice != "none") or bool(body.stops())
        self.live_calls = ToolCallStream() if ToolCallStream.wanted(body) else None
        self.include_usage = bool((body.stream_options or {}).get("include_usage"))
        engine = getattr(self.backend, "engine", None)
        self.tokenizer: Any = getattr(engine, "tokenizer", None)
        self.eos: set[int] = getattr(engine, "eos_ids", set())

    async def events(
        self, first: tuple[str, Any] | None, source: AsyncIterator[tuple[str, Any]]
    ) -> AsyncIterator[bytes]:
        """The decode loop: each item's events, an in-band error if the backend fails
        mid-stream, then [DONE] (the response's last piece)."""
        if self.tokenizer is not None:
            yield self._chunk({"role": "assistant", "content": ""})
        item = first
        try:
            while item is not None:
                kind, value = item
                if kind == "token":
                    self.got_ids.append(value[0])
                    self.got_lps.append(value[1])
                    if self.tokenizer is None:  # no text of ours to send
                        pass
                    elif self.live_calls is not None:
                        for delta in self._call_deltas(self.live_calls, value[0]):
                            yield delta
                    elif not self.buffered and (text := self._token_text(value)) is not None:
                        yield text
                        self.shown = len(self.got_ids)  # sent: the client has their text
                elif kind == "chunks":  # upstream: pass through under our id and version
                    for c in value:  # (the chunks of one read: one write)
                        c["id"], c["model"] = self.completion_id, self.model_id
                    yield b"".join([_sse(c) for c in value])
                    self.sent_chunks.extend(value)
                elif kind == "done":
                    if self.tokenizer is not None:
                        for piece in self._final_events(value):
                            yield piece
                    self._completed(value)
                item = await _next_item(source, self.state.timeout_s)
        except Exception as exc:  # mid-stream failure: tell the client in-band, count it
            yield self._failed_mid_stream(exc)
        assert self.response is not None
        self.response.last = True
        yield b"data: [DONE]\n\n"
        self.response.finished = True

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **kw: Any) -> bytes:
        """One chunk of this completion as a server-sent event."""
        return _sse(chunk(self.completion_id, self.model_id, delta, finish, **kw))

    def _call_deltas(self, live_calls: ToolCallStream, token: int) -> Iterator[bytes]:
        """A tools answer: OpenAI's tool-call deltas as it decodes."""
        if token not in self.eos:
            self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            for delta in live_calls.feed(text):
                yield self._chunk(delta)

    def _token_text(self, value: tuple[int, float, Any]) -> bytes | None:
        """The text a token adds (None while it ends in a partial character), with its
        log-probs when asked for."""
        tok, lp, tops = value
        tokenizer = self.tokenizer
        if tok not in self.eos:
            self.ids.append(tok)
        text = tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or len(text) <= len(self.sent):
            return None
        delta, self.sent = text[len(self.sent) :], text
        lpb = None
        if self.body.logprobs:
            t = tokenizer.decode([tok])
            alts = [{"token": tokenizer.decode([a]), "logprob": v, "bytes": None} for a, v in tops]
            lpb = {
                "content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": alts}
                ]
            }
        return self._chunk({"content": delta}, logprobs=lpb)

    def _final_events(self, gen: Generation) -> Iterator[bytes]:
        """The local engine's last events: the rest of the answer (all of it when
        buffered) or its tool calls, the finish reason, and the usage when asked for."""
        if self.live_calls is not None:
            text = self.tokenizer.decode(
                [i for i in gen.completion_token_ids if i not in self.eos],
                skip_special_tokens=True,
            )
            for delta in self.live_calls.finish(text, gen.tool_calls):
                yield self._chunk(delta)
        elif gen.tool_calls:
            for delta in tool_call_deltas(gen.tool_calls):
                yield self._chunk(delta)
        elif self.buffered or len(gen.content or "") > len(self.sent):
            rest = (gen.content or "")[len(self.sent) if not self.buffered else 0 :]
            lpb = (
                logprobs_block(gen, self.body.top_logprobs)
                if (self.buffered and self.body.logprobs)
                else None
            )
            if rest or lpb:
                yield self._chunk({"content": rest}, logprobs=lpb)
        yield self._chunk({}, gen.finish_reason)
        if self.include_usage:
            usage = {
                "prompt_tokens": gen.prompt_tokens,
                "completion_tokens": gen.completion_tokens,
                "total_tokens": gen.prompt_tokens + gen.completion_tokens,
            }
            yield _sse(
                {
                    "id": self.completion_id,
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": self.model_id,
                    "choices": [],
                    "usage": usage,
                }
            )

    def _completed(self, gen: Generation) -> None:
        """The finished completion: latency, tokens, its log row and capture."""
        state, stats = self.state, self.stats
        stats.latency_ms.append((time.perf_counter() - self.started) * 1000)
        stats.completion_tokens += gen.completion_tokens
        _log(state, self.completion_id, self.model_id, self.session, gen)
        self.logged = True
        if self.tracked is not None and state.capture is not None:
            state.capture.observe(self.tracked, self.body, gen, self.completion_id, self.model_id)
        elif state.capture is not None:
            state.capture.served(self.completion_id)

    def _failed_mid_stream(self, exc: Exception) -> bytes:
        """A failure after the 200 went out: counted as the backend's (>= 500) or refused
        as the input's, told to capture, and sent as an in-band error event."""
        state, model_id = self.state, self.model_id
        status, msg = classify(exc, model_id)
        if status >= 500:  # the backend's own failure
            self.stats.errors += 1
            if status == 504:
                self.stats.timeouts += 1
        else:
            _note_refusal(state, model_id, status, msg)
        if self.tracked is not None and state.capture is not None and not self.logged:
            state.capture.failed(
                self.tracked,
                self.body,
                status,
                f"failed mid-stream: {msg}",
                self.completion_id,
                model_id,
            )
        return _sse(
            error_body(
                f"model version {model_id} failed mid-stream: {msg}",
                "server_error" if status >= 500 else "invalid_request_error",
                str(status),
            )
        )

    def cancelled(self) -> None:
        """The log row (and capture's failed turn) of a stream the client closed early:
        what it was sent, as the engine's partial generation or the upstream's chunks."""
        if self.logged:
            return
        got_ids, shown = self.got_ids, self.shown
        engine: Any = getattr(self.backend, "engine", None)
        if hasattr(engine, "partial"):
            gen = engine.partial(self.body, got_ids[:shown], self.got_lps[:shown])
        else:  # an upstream's chunks as they went out (token ids where it sends them)
            gen = Generation(content="")
            for c in self.sent_chunks:
                _accumulate(gen, c)
            gen.finish_reason = "cancelled"
        self.stats.completion_tokens += len(got_ids)
        _log(self.state, self.completion_id, self.model_id, self.session, gen)
        if self.tracked is not None and self.state.capture is not None:
            self.state.capture.failed(
                self.tracked,
                self.body,
                499,
                "the client closed the stream before its end"
                + (f" ({shown} of {len(got_ids)} tokens sent)" if got_ids else ""),
                self.completion_id,
                self.model_id,
            )
