"""The OTLP/HTTP receiver on the control API: GenAI semantic-convention spans exported by the
OpenTelemetry SDK's own OTLP exporter (protobuf), OpenInference spans as OTLP/JSON, bad
bodies, truncation; the trajectories join the gateway's completion log by response id."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

import httpx
import pytest
from capture_kit import VERSION, Harness, stream_docs
from openai import AsyncOpenAI
from toolkit import CALL, FINAL, SYSTEM, TASK, TOOLS, add, assert_tool_episode, steer

from agentrl.capture.otlp import NAMESPACE


def _tid(trace_hex: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"otlp\x00{trace_hex}"))


async def test_gen_ai_spans_from_the_otel_sdk_become_a_token_exact_trajectory(
    harness: Harness,
) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="[frameworks] extra")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "calc-agent"}))
    provider.add_span_processor(
        # a background thread exports: the exporter's HTTP calls are blocking
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{harness.api}/v1/traces"))
    )
    tracer = provider.get_tracer("test")
    client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    ids = []
    with tracer.start_as_current_span(
        "invoke_agent calc", attributes={"gen_ai.operation.name": "invoke_agent"}
    ) as root:
        trace_hex = format(root.get_span_context().trace_id, "032x")
        for choice in (CALL, FINAL):
            with tracer.start_as_current_span("chat agentrl-policy") as span:
                r = await client.chat.completions.create(
                    model="agentrl-policy",
                    messages=messages,  # type: ignore[arg-type]
                    tools=TOOLS,  # type: ignore[arg-type]
                    extra_body=steer(choice),
                )
                msg = r.choices[0].message
                ids.append(r.id)
                parts: list[dict[str, Any]] = [
                    {
                        "type": "tool_call",
                        "id": c.id,
                        "name": c.function.name,
                        "arguments": json.loads(c.function.arguments),
                    }
                    for c in msg.tool_calls or []  # type: ignore[union-attr]
                ] or [{"type": "text", "content": msg.content}]
                span.set_attributes(
                    {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.request.model": "agentrl-policy",
                        "gen_ai.response.model": r.model,
                        "gen_ai.response.id": r.id,
                        "gen_ai.agent.name": "calc",
                        "gen_ai.system_instructions": json.dumps(
                            [{"type": "text", "content": SYSTEM}]
                        ),
                        "gen_ai.input.messages": json.dumps(_semconv(messages[1:])),
                        "gen_ai.output.messages": json.dumps(
                            [{"role": "assistant", "parts": parts}]
                        ),
                    }
                )
            messages.append(msg.model_dump(exclude_none=True))
            for c in msg.tool_calls or []:
                with tracer.start_as_current_span(
                    "execute_tool add",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "add",
                        "gen_ai.tool.call.id": c.id,
                    },
                ) as ts:
                    out = add(**json.loads(c.function.arguments))  # type: ignore[union-attr]
                    ts.set_attribute("gen_ai.tool.call.result", out)
                messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
    await asyncio.to_thread(provider.shutdown)
    await client.close()
    traj = await harness.trajectory(_tid(trace_hex))
    assert_tool_episode(traj, VERSION)
    assert [t["action"]["completion_id"] for t in traj["turns"]] == ids
    cap = traj["metadata"]["capture"]
    assert cap["source"] == "otlp" and cap["token_exact"] is True and cap["trace_id"] == trace_hex
    assert traj["agent_id"] == "calc"
    logged = {d["completion_id"] for d in await stream_docs(harness.bus, "RL_COMPLETIONS")}
    assert set(ids) <= logged  # the join to exact tokens
    # feedback names the trace as the episode
    await harness.reward_versions(traj["trajectory_id"], 1)
    r = await harness.feedback(episode_id=trace_hex, metric_name="ok", value=True)
    assert r.status_code == 202, r.text
    await harness.reward_versions(traj["trajectory_id"], 2)


def _semconv(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if m["role"] == "tool":
            parts = [
                {"type": "tool_call_response", "id": m["tool_call_id"], "response": m["content"]}
            ]
        elif m.get("tool_calls"):
            parts = [
                {
                    "type": "tool_call",
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                }
                for c in m["tool_calls"]
            ]
        else:
            parts = [{"type": "text", "content": m["content"]}]
        out.append({"role": m["role"], "parts": parts})
    return out


def _kv(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    def val(v: Any) -> dict[str, Any]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        return {"stringValue": str(v)}

    return [{"key": k, "value": val(v)} for k, v in attrs.items()]


def _json_span(trace: str, span: str, parent: str, name: str, t: int, attrs: dict[str, Any]) -> Any:
    return {
        "traceId": trace,
        "spanId": span,
        "parentSpanId": parent,
        "name": name,
        "startTimeUnixNano": str(t),
        "endTimeUnixNano": str(t + 1000),
        "attributes": _kv(attrs),
    }


def openinference_trace(trace: str, n_llm: int = 2) -> dict[str, Any]:
    """What smolagents' OpenInference instrumentation emits for a tool-calling run, as OTLP/JSON."""
    root = os.urandom(8).hex()
    spans = [
        _json_span(
            trace,
            root,
            "",
            "ToolCallingAgent.run",
            10**18 + 9_000_000,
            {"openinference.span.kind": "AGENT", "input.value": TASK},
        ),
    ]
    llm1 = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "gpt-x",
        "llm.input_messages.0.message.role": "system",
        "llm.input_messages.0.message.content": SYSTEM,
        "llm.input_messages.1.message.role": "user",
        "llm.input_messages.1.message.content": TASK,
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id": "call_1",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "add",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"a": 2, "b": 3}',
    }
    tool = {"openinference.span.kind": "TOOL", "tool.name": "add", "output.value": "5"}
    llm2 = {
        "openinference.span.kind": "LLM",
        "llm.model_name": "gpt-x",
        **{k: v for k, v in llm1.items() if k.startswith("llm.input_messages.")},
        "llm.input_messages.2.message.role": "assistant",
        "llm.input_messages.2.message.tool_calls.0.tool_call.id": "call_1",
        "llm.input_messages.2.message.tool_calls.0.tool_call.function.name": "add",
        "llm.input_messages.2.message.tool_calls.0.tool_call.function.arguments": '{"a": 2, "b": 3}',
        "llm.input_messages.3.message.role": "tool",
        "llm.input_messages.3.message.tool_call_id": "call_1",
        "llm.input_messages.3.message.content": "5",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": FINAL,
    }
    base = 10**18
    spans += [
        _json_span(trace, os.urandom(8).hex(), root, "LLM", base + 1_000_000, llm1),
        _json_span(trace, os.urandom(8).hex(), root, "add", base + 2_000_000, tool),
    ]
    if n_llm > 1:
        spans.append(_json_span(trace, os.urandom(8).hex(), root, "LLM", base + 3_000_000, llm2))
    children, parent = spans[1:], spans[:1]
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _kv({"service.name": "smol"})},
                "scopeSpans": [{"spans": children}, {"spans": parent}],
            }
        ]
    }


async def test_openinference_json_trace_without_response_ids_has_no_token_data(
    harness: Harness,
) -> None:
    trace = os.urandom(16).hex()
    async with httpx.AsyncClient() as c:
        r = await c.post(f"{harness.api}/v1/traces", json=openinference_trace(trace))
    assert r.status_code == 200, r.text
    assert r.json()["trajectory_ids"] == [_tid(trace)]
    traj = await harness.trajectory(_tid(trace))
    assert_tool_episode(traj, "gpt-x", exact=False)
    assert all("completion_id" not in t["action"] for t in traj["turns"])
    assert traj["metadata"]["capture"]["token_exact"] is False


async def test_bad_bodies_are_400_with_the_reason_and_counted(harness: Harness) -> None:
    url = f"{harness.api}/v1/traces"
    async with httpx.AsyncClient() as c:
        bad = [
            await c.post(
                url,
                content=b"\x0a\xff\xff garbage",
                headers={"content-type": "application/x-protobuf"},
            ),
            await c.post(url, content=b"{not json", headers={"content-type": "application/json"}),
            await c.post(
                url, json={"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}
            ),
            await c.post(url, content=b"x", headers={"content-type": "text/plain"}),
            await c.post(
                url,
                content=b"x",
                headers={"content-type": "application/json", "content-encoding": "gzip"},
            ),
        ]
        stats = (await c.get(f"{harness.api}/v1/traces/stats")).json()
    assert [r.status_code for r in bad] == [400] * 5
    assert all("malformed OTLP body" in r.text for r in bad)
    assert "content type" in bad[3].text and "gzip" in bad[4].text
    assert stats["bad_requests"] >= 5


async def test_protobuf_trace_too_large_is_truncated_with_a_marker(harness: Harness) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    harness_rec_settings = {"otlp_max_spans": 4}
    from agentrl.capture.api import OtlpReceiver
    from agentrl.capture.settings import CaptureSettings

    # the control API's receiver, with a small span cap
    app_state_receiver = OtlpReceiver(harness.bus, CaptureSettings(**harness_rec_settings))
    trace = os.urandom(16)
    root = os.urandom(8)

    def span(i: int, parent: bytes, attrs: dict[str, str]) -> Span:
        return Span(
            trace_id=trace,
            span_id=os.urandom(8) if i else root,
            parent_span_id=parent,
            name=f"s{i}",
            start_time_unix_nano=10**18 + i,
            end_time_unix_nano=10**18 + i + 1,
            attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attrs.items()],
        )

    llm = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": TASK}]}]
        ),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": FINAL}]}]
        ),
    }
    spans = [span(i, root, llm) for i in range(1, 10)] + [span(0, b"", {})]
    req = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])]
    )
    from agentrl.capture.otlp import decode

    ids = await app_state_receiver.receive(
        decode(req.SerializeToString(), "application/x-protobuf")
    )
    assert ids == [_tid(trace.hex())]
    traj = await harness.trajectory(ids[0])
    cap = traj["metadata"]["capture"]
    assert cap["truncated"] is True and cap["spans_dropped"] == 6
    assert len(traj["turns"]) == 4
    # and over HTTP the same body is accepted by the control API's receiver
    async with httpx.AsyncClient() as c:
        r = await c.post(
            f"{harness.api}/v1/traces",
            content=req.SerializeToString(),
            headers={"content-type": "application/x-protobuf"},
        )
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
