"""`agentrl bench capture`: episodes at the gateway under load, and the OTLP receiver's rate.

1. `sessions` concurrent sessions of `turns` tool-calling turns each (the last one a text
   answer) through the gateway serving the tiny model (answers steered by `guided_choice`,
   so the model's cost is one cached scoring per distinct prompt and the figures are the
   capture path's), each ended with `POST /v1/episodes/{id}/end`. Figures: episodes sent
   and published (read back from the trajectory stream), `lost`, and `added_p99_ms`: the
   time episode tracking (`CaptureService.observe`) adds to one request, p99.
2. The cases that used to duplicate, split, merge or lose episodes, each `extra` times:
   `otlp_join` (a session that also exports its OTLP trace with the gateway's response
   ids), `threads` (a crew's two tasks and a retry with another prompt under one key),
   `timeout` (a turn pinned to a version that never answers: 504, then the run goes on),
   `user_pairs` (two overlapping conversations of one OpenAI `user`, no session key),
   `oversized` (at most 5: an episode over the bench NATS's 1 MiB max_payload: trimmed,
   and the ones after it flow).
   Every published trajectory is read back: `duplicate_episodes` (two trajectories holding
   one completion), `split_episodes` (one episode's completions in several),
   `merged_episodes` (one trajectory holding several episodes'), `lost` (an episode in
   none); all must be 0.
3. OTLP: protobuf export requests of GenAI traces (an agent span, 4 chat spans, 3 tool
   spans) posted to the control API's `/v1/traces`; `otlp_spans_per_s` end to end (decode,
   assemble, build, redact, publish, index).
The last line is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.bench.options import CaptureBench

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}
CALL = json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}})
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]


async def _post(client: Any, url: str, body: dict[str, Any], sid: str | None) -> Any:
    """POST with retries: 429 (the gateway's admission limit) and a keep-alive connection
    closed under us are tried again shortly; None when it never got through."""
    import httpx

    retried = False
    headers = {"x-agentrl-session": sid} if sid else {}
    for _ in range(30):
        try:
            r = await client.post(url, json=body, headers=headers)
        except httpx.TransportError:
            retried = True
            await asyncio.sleep(0.05)
            continue
        if r.status_code != 429:
            r.retried = retried
            return r
        await asyncio.sleep(0.05)
    return None


async def _session(client: Any, url: str, sid: str, turns: int, ids: list[str]) -> int:
    """One agent: `turns` requests, then the end of its episode. Returns failed requests
    (`ids`: the completion ids it was served)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 3?"}]
    failed = 0
    for t in range(turns):
        final = t == turns - 1
        body = {
            "model": "agentrl-policy",
            "messages": messages,
            "tools": TOOLS,
            "guided_choice": ["The sum is 5." if final else CALL],
        }
        r = await _post(client, f"{url}/v1/chat/completions", body, sid)
        if r is None or r.status_code != 200:
            failed += 1
            continue
        doc = r.json()
        ids.append(doc["id"])
        msg = doc["choices"][0]["message"]
        messages = [*messages, {k: v for k, v in msg.items() if v is not None}]
        for c in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "5"})
    r = await _post(client, f"{url}/v1/episodes/{sid}/end", {"success": True}, sid)
    # a 404 after a retry: the first attempt ended it and its answer was lost
    if r is None or not (r.status_code == 200 or (r.status_code == 404 and r.retried)):
        failed += 1
    return failed


@dataclass
class Sent:
    """One episode as the client knows it: its key and the completions it was served."""

    scenario: str
    key: str
    completion_ids: list[str] = field(default_factory=list)
    failed: int = 0  # requests that failed on purpose (a timeout scenario)


async def _turns(
    client: Any,
    url: str,
    sent: Sent,
    messages: list[dict[str, Any]],
    choices: list[str],
    *,
    sid: str | None,
    extra: dict[str, Any] | None = None,
    model: str = "agentrl-policy",
) -> list[dict[str, Any]]:
    """Requests of one conversation (each answer steered); returns the history."""
    for choice in choices:
        body = {
            "model": model,
            "messages": messages,
            "tools": TOOLS,
            "guided_choice": [choice],
            **(extra or {}),
        }
        r = await _post(client, f"{url}/v1/chat/completions", body, sid)
        if r is None or r.status_code != 200:
            sent.failed += 1
            continue
        doc = r.json()
        sent.completion_ids.append(doc["id"])
        msg = doc["choices"][0]["message"]
        messages = [*messages, {k: v for k, v in msg.items() if v is not None}]
        for c in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "5"})
    return messages


def _oi_trace(completion_ids: list[str]) -> dict[str, Any]:
    """An OpenInference trace (OTLP/JSON) of calls the gateway served: their response ids."""
    trace, root = os.urandom(16).hex(), os.urandom(8).hex()

    def span(sid: str, parent: str, kind: str, attrs: dict[str, str], t: int) -> dict[str, Any]:
        return {
            "traceId": trace,
            "spanId": sid,
            "parentSpanId": parent,
            "name": kind,
            "startTimeUnixNano": str(t),
            "endTimeUnixNano": str(t + 1_000_000),
            "attributes": [
                {"key": k, "value": {"stringValue": v}}
                for k, v in {"openinference.span.kind": kind, **attrs}.items()
            ],
        }

    spans = [
        span(os.urandom(8).hex(), root, "LLM", {"llm.response.id": cid}, 10**18 + 10**7 * i)
        for i, cid in enumerate(completion_ids)
    ]
    spans.append(span(os.urandom(8).hex(), root, "TOOL", {"tool.name": "add"}, 10**18 + 5))
    spans.append(span(root, "", "AGENT", {}, 10**18))
    return {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}


async def _scenario(name: str, client: Any, url: str, api: str, i: int, capture: Any) -> list[Sent]:
    """One instance of a hard case; returns the episodes it sent."""
    task: list[dict[str, Any]] = [{"role": "user", "content": f"What is 2 + 3? ({name} {i})"}]
    final = "The sum is 5."
    sid = f"{name}-{i}"
    sent = Sent(name, sid)
    if name == "otlp_join":
        await _turns(client, url, sent, task, [CALL, final], sid=sid)
        r = await client.post(f"{api}/v1/traces", json=_oi_trace(sent.completion_ids))
        r.raise_for_status()
    elif name == "threads":
        await _turns(client, url, sent, task, [CALL, final], sid=sid)
        second = [{"role": "user", "content": f"Now add 4 and 4. ({i})"}]
        await _turns(client, url, sent, second, [CALL, final], sid=sid)
        retry = [{"role": "user", "content": f"Answer in JSON: 4 + 4? ({i})"}]
        await _turns(client, url, sent, retry, [final], sid=sid)
    elif name == "timeout":
        hist = await _turns(client, url, sent, task, [CALL], sid=sid)
        await _turns(client, url, sent, hist, [final], sid=sid, model="bench-slow")
        await _turns(client, url, sent, hist, [final], sid=sid)  # the agent retries
    elif name == "user_pairs":
        user = {"user": f"acct-{i}"}
        a, b = Sent(name, ""), Sent(name, "")
        other = [{"role": "user", "content": f"Add 10 and 1. ({i})"}]
        ha = await _turns(client, url, a, task, [CALL], sid=None, extra=user)
        hb = await _turns(client, url, b, other, [CALL], sid=None, extra=user)
        await _turns(client, url, b, hb, [final], sid=None, extra=user)
        await _turns(client, url, a, ha, [final], sid=None, extra=user)
        for s in (a, b):
            s.key = s.completion_ids[0] if s.completion_ids else ""
            if s.key:
                r = await _post(client, f"{url}/v1/episodes/{s.key}/end", {}, None)
                if r is None or r.status_code != 200:
                    s.failed += 100  # an end that failed: counted below
        return [a, b]
    elif name == "oversized":
        from datetime import UTC, datetime

        big = [{"role": "user", "content": "x" * (3 * MAX_PAYLOAD // 2)}]  # over max_payload
        capture.book.observe(
            sid,
            big,
            {"content": "ok"},
            f"chatcmpl-big-{i}",
            "bench-v1",
            now=time.monotonic(),
            at=datetime.now(UTC),
        )
        sent.completion_ids.append(f"chatcmpl-big-{i}")
    r = await _post(client, f"{url}/v1/episodes/{sid}/end", {"success": True}, sid)
    if r is None or r.status_code != 200:
        sent.failed += 100
    return [sent]


def _audit(sent: list[Sent], trajectories: list[dict[str, Any]]) -> dict[str, Any]:
    """Duplicates, splits, merges and losses, from the completion ids each trajectory holds."""
    holders: dict[str, list[str]] = {}  # completion id -> trajectory ids
    by_session: dict[str, list[str]] = {}
    for t in trajectories:
        cap = (t.get("metadata") or {}).get("capture") or {}
        ids = set(cap.get("completion_ids") or [])
        ids |= {x["action"].get("completion_id") for x in t["turns"]} - {None}
        for cid in ids:
            holders.setdefault(cid, []).append(t["trajectory_id"])
        by_session.setdefault(t["session_id"], []).append(t["trajectory_id"])
    episode_of = {cid: k for k, s in enumerate(sent) for cid in s.completion_ids}
    out: dict[str, Any] = dict.fromkeys(("published", "duplicate", "split", "merged", "lost"), 0)
    closed_by = {
        t["trajectory_id"]: ((t.get("metadata") or {}).get("capture") or {}).get("closed_by")
        for t in trajectories
    }
    out["examples"] = []
    for s in sent:
        trajs = [h for cid in s.completion_ids for h in holders.get(cid, [])]
        if not s.completion_ids:
            trajs = by_session.get(s.key, [])
        distinct = set(trajs)
        if not distinct:
            out["lost"] += 1
            continue
        out["published"] += 1
        if any(len(holders.get(cid, [])) > 1 for cid in s.completion_ids):
            out["duplicate"] += 1
        elif len(distinct) > 1:
            out["split"] += 1
        if len(distinct) > 1 and len(out["examples"]) < 3:
            out["examples"].append(
                {
                    "scenario": s.scenario,
                    "key": s.key,
                    "closed_by": [closed_by[t] for t in distinct],
                }
            )
    merged = set()
    for t in trajectories:
        cap = (t.get("metadata") or {}).get("capture") or {}
        eps = {episode_of[c] for c in cap.get("completion_ids") or [] if c in episode_of}
        if len(eps) > 1:
            merged |= eps
    out["merged"] = len(merged)
    return out


def _otlp_request(traces: int) -> tuple[bytes, int]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    def kv(attrs: dict[str, str]) -> list[KeyValue]:
        return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attrs.items()]

    user: list[Any] = [{"role": "user", "parts": [{"type": "text", "content": "What is 2 + 3?"}]}]
    call = {"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}
    spans = []
    for _ in range(traces):
        trace, root = os.urandom(16), os.urandom(8)
        history = list(user)
        t = 10**18
        for i in range(4):
            out = [
                {
                    "role": "assistant",
                    "parts": [call if i < 3 else {"type": "text", "content": "5"}],
                }
            ]
            spans.append(
                Span(
                    trace_id=trace,
                    span_id=os.urandom(8),
                    parent_span_id=root,
                    name="chat",
                    start_time_unix_nano=t + 10 * i,
                    end_time_unix_nano=t + 10 * i + 5,
                    attributes=kv(
                        {
                            "gen_ai.operation.name": "chat",
                            "gen_ai.response.model": "bench",
                            "gen_ai.input.messages": json.dumps(history),
                            "gen_ai.output.messages": json.dumps(out),
                        }
                    ),
                )
            )
            if i < 3:
                spans.append(
                    Span(
                        trace_id=trace,
                        span_id=os.urandom(8),
                        parent_span_id=root,
                        name="execute_tool add",
                        start_time_unix_nano=t + 10 * i + 6,
                        end_time_unix_nano=t + 10 * i + 8,
                        attributes=kv(
                            {
                                "gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": "add",
                                "gen_ai.tool.call.result": "5",
                            }
                        ),
                    )
                )
                history = [
                    *history,
                    out[0],
                    {
                        "role": "tool",
                        "parts": [{"type": "tool_call_response", "id": "c1", "response": "5"}],
                    },
                ]
        spans.append(
            Span(
                trace_id=trace,
                span_id=root,
                name="invoke_agent bench",
                start_time_unix_nano=t,
                end_time_unix_nano=t + 100,
                attributes=kv({"gen_ai.operation.name": "invoke_agent"}),
            )
        )
    req = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])]
    )
    return req.SerializeToString(), len(spans)


SCENARIOS = ("otlp_join", "threads", "timeout", "user_pairs", "oversized")
MAX_PAYLOAD = 2**20  # the bench's NATS: 1 MiB, so an oversized episode is quick to redact


async def run(
    sessions: int = 1000,
    turns: int = 5,
    connections: int = 64,
    otlp_traces: int = 2000,
    extra: int = 20,
) -> dict[str, Any]:
    """The stack up (NATS, the gateway over the tiny model and a version that never answers,
    the control API), the sessions and the scenarios sent, every published episode read
    back and audited, OTLP posted, the stack stopped; -> the figures."""
    import httpx

    from agentrl.bus import EmbeddedNats

    tmp = tempfile.mkdtemp(prefix="agentrl-bench-capture-")
    with EmbeddedNats(data_dir=tmp, max_payload=MAX_PAYLOAD) as nats:
        stack = await _Stack.start(nats.url, tmp, sessions, connections)
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        before = await stack.trajectories()
        async with httpx.AsyncClient(limits=limits, timeout=120.0) as client:
            load = await _send_episodes(client, stack, sessions, turns, extra)
            await stack.capture.flush()
            docs = await _docs(stack.bus, before)
            audit = _audit(load.plain + load.hard, docs)
            otlp = await _post_otlp(client, stack.api_url, otlp_traces)
        otlp_published = await stack.trajectories() - before - len(docs)
        await stack.stop()
    return _figures(sessions, turns, load, len(docs), audit, stack.capture, otlp, otlp_published)


@dataclass
class _Stack:
    """The bench's services on one embedded NATS: capture and the completion log running,
    the gateway, the control API and the stalled upstream served by uvicorn."""

    bus: Any
    capture: Any
    done: asyncio.Event
    tasks: list[asyncio.Task[Any]]
    servers: list[Any]
    gateway_url: str
    api_url: str

    @classmethod
    async def start(cls, nats_url: str, tmp: str, sessions: int, connections: int) -> _Stack:
        from agentrl.app.api import create_app
        from agentrl.bus import Bus
        from agentrl.capture.service import CaptureService
        from agentrl.capture.settings import CaptureSettings
        from agentrl.core.settings import Settings
        from agentrl.serving.backends import LocalBackend, UpstreamBackend
        from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app
        from agentrl.serving.local import LocalEngine

        bus = await Bus.connect(nats_url, name="bench-capture")
        await bus.ensure_streams()
        done = asyncio.Event()
        # every episode is ended by its client: an idle close would only mean that a
        # session waited that long for a connection on a loaded machine (then its next
        # request starts another episode under the key, by the rule)
        capture = CaptureService(
            bus, CaptureSettings(max_open=max(10_000, sessions), idle_timeout_s=3600.0)
        )
        capture.observe_s = deque()
        log = CompletionLog(bus)
        state = GatewayState("agentrl-policy", completion_log=log, capture=capture)
        state.max_inflight = max(getattr(state, "max_inflight", 64), 2 * connections)
        engine = LocalEngine("tiny", seed=0, tiny_kwargs=TINY, max_batch_size=8, max_wait_ms=2.0)
        state.backends["bench-v1"] = LocalBackend(engine, Path(tmp))
        state.set_split({"bench-v1": 1.0}, ["bench-v1"])
        sport = _free_port()
        slow_server = await _serve(_stalled_app(), sport)
        # a version that never answers (its own short timeout: the 504 of a busy backend)
        state.backends["bench-slow"] = UpstreamBackend(
            f"http://127.0.0.1:{sport}/v1", timeout_s=0.3
        )
        tasks = [
            asyncio.create_task(capture.run(done, tick_s=0.2)),
            asyncio.create_task(log.run(done)),
        ]
        gport, aport = _free_port(), _free_port()
        gw = await _serve(create_gateway_app(state), gport)
        api = await _serve(create_app(Settings(data_dir=tmp), bus), aport)
        return cls(
            bus,
            capture,
            done,
            tasks,
            [gw, api, slow_server],
            f"http://127.0.0.1:{gport}",
            f"http://127.0.0.1:{aport}",
        )

    async def trajectories(self) -> int:
        """Messages in the trajectory stream."""
        return int((await self.bus.js.stream_info("RL_TRAJECTORIES")).state.messages)

    async def stop(self) -> None:
        self.done.set()
        for server in self.servers:
            server.should_exit = True
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.bus.close()


async def _serve(app: Any, port: int) -> Any:
    """`app` served by uvicorn on `port` (a task of the running loop), once it listens."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="error",
            lifespan="off",
            access_log=False,
        )
    )
    asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Load:
    """What the bench sent: the plain sessions (and their failed requests, their time),
    and the scenarios' episodes."""

    plain: list[Sent]
    failed: list[int]
    gateway_s: float
    hard: list[Sent]


async def _send_episodes(
    client: Any, stack: _Stack, sessions: int, turns: int, extra: int
) -> _Load:
    """The plain sessions, all at once (timed: the gateway's rate), then every scenario
    `extra` times (the oversized one at most 5)."""
    started = time.perf_counter()
    plain = [Sent("plain", f"bench-{i}") for i in range(sessions)]
    failed = await asyncio.gather(
        *(_session(client, stack.gateway_url, p.key, turns, p.completion_ids) for p in plain)
    )
    gateway_s = time.perf_counter() - started
    hard: list[list[Sent]] = await asyncio.gather(
        *(
            _scenario(name, client, stack.gateway_url, stack.api_url, i, stack.capture)
            for name in SCENARIOS
            for i in range(extra if name != "oversized" else min(extra, 5))
        )
    )
    return _Load(plain, list(failed), gateway_s, [s for group in hard for s in group])


@dataclass
class _Otlp:
    traces: int
    spans: int
    seconds: float


async def _post_otlp(client: Any, api_url: str, traces: int) -> _Otlp:
    """Protobuf export requests of 100 traces each, posted one after another (timed)."""
    per_request = 100
    bodies = [_otlp_request(per_request) for _ in range(max(1, traces // per_request))]
    started = time.perf_counter()
    spans = 0
    for body, n in bodies:
        r = await client.post(
            f"{api_url}/v1/traces",
            content=body,
            headers={"content-type": "application/x-protobuf"},
        )
        r.raise_for_status()
        spans += n
    return _Otlp(len(bodies) * per_request, spans, time.perf_counter() - started)


def _figures(
    sessions: int,
    turns: int,
    load: _Load,
    published: int,
    audit: dict[str, Any],
    capture: Any,
    otlp: _Otlp,
    otlp_published: int,
) -> dict[str, Any]:
    """The bench's JSON: the headline figures last, in the order the guide names them.
    A scenario's failed requests count, except the timeout scenario's one on purpose."""
    wall = sorted(w for w, _ in capture.observe_s)
    cpu = sorted(c for _, c in capture.observe_s)

    def p(xs: list[float], q: float) -> float | None:
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else None

    hard_sent = load.hard
    by_name = {n: [s for s in hard_sent if s.scenario == n] for n in SCENARIOS}
    return {
        "sessions": sessions,
        "turns": turns,
        "requests": sessions * turns,
        "failed_requests": sum(load.failed)
        + sum(s.failed for s in hard_sent if s.scenario != "timeout")
        + sum(max(0, s.failed - 1) for s in by_name["timeout"]),
        "timeouts_on_purpose": sum(min(s.failed, 1) for s in by_name["timeout"]),
        "scenarios": {n: len(v) for n, v in by_name.items()},
        "trajectories": published,
        "enriched_by_otlp": capture.counts.enriched,
        "trimmed": capture.counts.trimmed,
        "dead_lettered": capture.counts.dead_lettered,
        "closed_idle": capture.book.counts.closed_idle,
        "closed_memory": capture.book.counts.closed_memory,
        "audit_examples": audit["examples"],
        "added_p50_ms": p(cpu, 0.5),
        "added_wall_p99_ms": p(wall, 0.99),  # includes being descheduled on a busy machine
        "gateway_requests_per_s": sessions * turns / load.gateway_s,
        "otlp_traces": otlp.traces,
        "otlp_trajectories": otlp_published,
        "episodes_sent": len(load.plain) + len(hard_sent),
        "episodes_published": audit["published"],
        "duplicate_episodes": audit["duplicate"],
        "split_episodes": audit["split"],
        "merged_episodes": audit["merged"],
        "lost": audit["lost"],
        "added_p99_ms": p(cpu, 0.99),  # CPU time of the request's thread in `observe`
        "otlp_spans_per_s": otlp.spans / otlp.seconds,
    }


def _stalled_app() -> Any:
    """An OpenAI-compatible server that never answers in time."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def never() -> dict[str, Any]:
        import contextlib

        with contextlib.suppress(asyncio.CancelledError):  # the bench's end: no traceback
            await asyncio.sleep(3600)
        return {}

    return app


async def _docs(bus: Any, after: int) -> list[dict[str, Any]]:
    """The trajectories published after stream message `after` (read, not consumed)."""
    info = await bus.js.stream_info("RL_TRAJECTORIES")
    out = []
    for seq in range(max(after + 1, info.state.first_seq), info.state.last_seq + 1):
        try:
            out.append(json.loads((await bus.js.get_msg("RL_TRAJECTORIES", seq)).data))
        except Exception:  # a gap in the stream
            continue
    return out


def main(
    sessions: int, turns: int, connections: int, otlp_traces: int, extra: int = 20
) -> dict[str, Any]:
    import logging

    from rich.console import Console
    from rich.table import Table

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    out = asyncio.run(run(sessions, turns, connections, otlp_traces, extra))
    table = Table(title="capture: episodes at the gateway, OTLP in")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in out.items():
        table.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
    Console().print(table)
    print(json.dumps(out))
    return out


def command(cfg: CaptureBench) -> None:
    """`agentrl bench capture`: exit status 1 when an episode was lost, failed,
    duplicated, split or merged."""
    import typer

    out = main(cfg.sessions, cfg.turns, cfg.connections, cfg.otlp_traces, cfg.extra)
    bad = ("lost", "failed_requests", "duplicate_episodes", "split_episodes")
    if any(out[k] for k in (*bad, "merged_episodes")):
        raise typer.Exit(1)
