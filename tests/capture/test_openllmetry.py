"""The guide's OpenLLMetry recipe, followed as written: `opentelemetry-instrumentation-openai`
(Traceloop's OpenLLMetry) on an openai SDK agent, spans exported over OTLP/HTTP to the
control API's `/v1/traces`, the run wrapped in a root span of its own. The trace becomes one
trajectory: the tool call with its arguments, its result, the answer; the chat calls name
the gateway's completions, so it is token-exact. Real gateway, control API and nats-server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from capture_kit import VERSION, Harness
from openai import AsyncOpenAI
from toolkit import CALL, FINAL, SYSTEM, TASK, TOOLS, add, assert_tool_episode, steer


async def test_the_openllmetry_recipe_makes_one_token_exact_trajectory(harness: Harness) -> None:
    pytest.importorskip("opentelemetry.instrumentation.openai", reason="[frameworks] extra")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # the recipe: a TracerProvider exporting to the control API, the instrumentor, a root span
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{harness.api}/v1/traces"))
    )
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        tracer = provider.get_tracer("my-agent")
        client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASK},
        ]
        ids = []
        with tracer.start_as_current_span("agent run") as root:
            trace_id = format(root.get_span_context().trace_id, "032x")
            for choice in (CALL, FINAL):
                r = await client.chat.completions.create(
                    model="agentrl-policy",
                    messages=messages,  # type: ignore[arg-type]
                    tools=TOOLS,  # type: ignore[arg-type]
                    temperature=0,
                    extra_body=steer(choice),
                )
                ids.append(r.id)
                msg = r.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                for c in msg.tool_calls or []:
                    out = add(**json.loads(c.function.arguments))  # type: ignore[union-attr]
                    messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
        await client.close()
        await asyncio.to_thread(provider.shutdown)
    finally:
        instrumentor.uninstrument()
    async with httpx.AsyncClient() as c:
        stats = (await c.get(f"{harness.api}/v1/traces/stats")).json()
    assert stats["published"] == 1 and stats["traces_without_llm_spans"] == 0, stats
    found = [
        t
        for t in await harness.trajectories()
        if t["metadata"].get("capture", {}).get("source") == "otlp"
        and trace_id in json.dumps(t["metadata"]["capture"])
    ]
    assert len(found) == 1, [t["metadata"].get("capture") for t in await harness.trajectories()]
    traj = found[0]
    assert traj["session_id"] == trace_id  # feedback names the trace id
    assert_tool_episode(traj, VERSION)
    assert [t["action"]["completion_id"] for t in traj["turns"]] == ids
    assert traj["metadata"]["capture"]["token_exact"] is True
