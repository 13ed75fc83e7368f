"""`agentrl bench capture`: episodes at the gateway under load, and the OTLP receiver's rate.

1. `sessions` concurrent sessions of `turns` tool-calling turns each (the last one a text
   answer) through the gateway serving the tiny model (answers steered by `guided_choice`,
   so the model's cost is one cached scoring per distinct prompt and the figures are the
   capture path's), each ended with `POST /v1/episodes/{id}/end`. Figures: episodes sent
   and published (read back from the trajectory stream), `lost`, and `added_p99_ms`: the
   time episode tracking (`CaptureService.observe`) adds to one request, p99.
2. OTLP: protobuf export requests of GenAI traces (an agent span, 4 chat spans, 3 tool
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
from pathlib import Path
from typing import Any

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


async def _post(client: Any, url: str, body: dict[str, Any], sid: str) -> Any:
    """POST with retries: 429 (the gateway's admission limit) and a keep-alive connection
    closed under us are tried again shortly; None when it never got through."""
    import httpx

    retried = False
    for _ in range(30):
        try:
            r = await client.post(url, json=body, headers={"x-agentrl-session": sid})
        except httpx.TransportError:
            retried = True
            await asyncio.sleep(0.05)
            continue
        if r.status_code != 429:
            r.retried = retried
            return r
        await asyncio.sleep(0.05)
    return None


async def _session(client: Any, url: str, sid: str, turns: int) -> int:
    """One agent: `turns` requests, then the end of its episode. Returns failed requests."""
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
        msg = r.json()["choices"][0]["message"]
        messages = [*messages, {k: v for k, v in msg.items() if v is not None}]
        for c in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "5"})
    r = await _post(client, f"{url}/v1/episodes/{sid}/end", {"success": True}, sid)
    # a 404 after a retry: the first attempt ended it and its answer was lost
    if r is None or not (r.status_code == 200 or (r.status_code == 404 and r.retried)):
        failed += 1
    return failed


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


async def run(
    sessions: int = 1000, turns: int = 5, connections: int = 64, otlp_traces: int = 2000
) -> dict[str, Any]:
    import httpx
    import uvicorn

    from agentrl.app.api import create_app
    from agentrl.bus import Bus, EmbeddedNats
    from agentrl.capture.service import CaptureService
    from agentrl.capture.settings import CaptureSettings
    from agentrl.deploy.backends import LocalBackend
    from agentrl.deploy.gateway import CompletionLog, GatewayState, create_gateway_app
    from agentrl.deploy.local import LocalEngine
    from agentrl.settings import Settings

    async def serve(app: Any, port: int) -> uvicorn.Server:
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

    def free_port() -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    tmp = tempfile.mkdtemp(prefix="agentrl-bench-capture-")
    with EmbeddedNats(data_dir=tmp) as nats:
        bus = await Bus.connect(nats.url, name="bench-capture")
        await bus.ensure_streams()
        stop = asyncio.Event()
        capture = CaptureService(bus, CaptureSettings(max_open=max(10_000, sessions)))
        capture.observe_s = deque()
        log = CompletionLog(bus)
        state = GatewayState("agentrl-policy", completion_log=log, capture=capture)
        state.max_inflight = max(getattr(state, "max_inflight", 64), 2 * connections)
        engine = LocalEngine("tiny", seed=0, tiny_kwargs=TINY, max_batch_size=8, max_wait_ms=2.0)
        state.backends["bench-v1"] = LocalBackend(engine, Path(tmp))
        state.set_split({"bench-v1": 1.0}, ["bench-v1"])
        tasks = [
            asyncio.create_task(capture.run(stop, tick_s=0.2)),
            asyncio.create_task(log.run(stop)),
        ]
        gport, aport = free_port(), free_port()
        gw = await serve(create_gateway_app(state), gport)
        api = await serve(create_app(Settings(data_dir=tmp), bus), aport)
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        before = (await bus.js.stream_info("RL_TRAJECTORIES")).state.messages
        async with httpx.AsyncClient(limits=limits, timeout=120.0) as client:
            started = time.perf_counter()
            failed = await asyncio.gather(
                *(
                    _session(client, f"http://127.0.0.1:{gport}", f"bench-{i}", turns)
                    for i in range(sessions)
                )
            )
            gateway_s = time.perf_counter() - started
            await capture.flush()
            published = (await bus.js.stream_info("RL_TRAJECTORIES")).state.messages - before
            # OTLP
            per_request = 100
            bodies = [_otlp_request(per_request) for _ in range(max(1, otlp_traces // per_request))]
            started = time.perf_counter()
            spans = 0
            for body, n in bodies:
                r = await client.post(
                    f"http://127.0.0.1:{aport}/v1/traces",
                    content=body,
                    headers={"content-type": "application/x-protobuf"},
                )
                r.raise_for_status()
                spans += n
            otlp_s = time.perf_counter() - started
        otlp_published = (
            (await bus.js.stream_info("RL_TRAJECTORIES")).state.messages - before - published
        )
        stop.set()
        gw.should_exit = api.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()
    wall = sorted(w for w, _ in capture.observe_s)
    cpu = sorted(c for _, c in capture.observe_s)

    def p(xs: list[float], q: float) -> float | None:
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else None

    return {
        "sessions": sessions,
        "turns": turns,
        "requests": sessions * turns,
        "failed_requests": sum(failed),
        "episodes_sent": sessions,
        "episodes_published": published,
        "lost": sessions - published,
        "added_p50_ms": p(cpu, 0.5),
        "added_p99_ms": p(cpu, 0.99),  # CPU time of the request's thread in `observe`
        "added_wall_p99_ms": p(wall, 0.99),  # includes being descheduled on a busy machine
        "gateway_requests_per_s": sessions * turns / gateway_s,
        "otlp_traces": len(bodies) * per_request,
        "otlp_trajectories": otlp_published,
        "otlp_spans_per_s": spans / otlp_s,
    }


def main(sessions: int, turns: int, connections: int, otlp_traces: int) -> dict[str, Any]:
    import logging

    from rich.console import Console
    from rich.table import Table

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    out = asyncio.run(run(sessions, turns, connections, otlp_traces))
    table = Table(title="capture: episodes at the gateway, OTLP in")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in out.items():
        table.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
    Console().print(table)
    print(json.dumps(out))
    return out
