"""A trace that reaches a control API in ANOTHER process than the gateway that served its
calls (a replica deployment: gateway and control API apart) still enriches the gateway's
episode (durations, tool spans) and is not published a second time: the receiver finds the
completion in the capture index and sends the trace's extras over NATS to the process that
holds the episode open. Real nats-server, the real control API in a child process, the real
OTel SDK exporter."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from capture_kit import Harness, free_port
from openai import AsyncOpenAI
from toolkit import CALL, FINAL, TASK, TOOLS, add, steer

from agentrl.bus import EmbeddedNats

CHILD = str(Path(__file__).with_name("_api_child.py"))


@pytest.fixture()
def other_api(server: EmbeddedNats, tmp_path: Path) -> Iterator[str]:
    """The control API in a process of its own; its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, CHILD, server.url, str(port), str(tmp_path / "child")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "the control API child exited"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the control API child did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def _run(client: AsyncOpenAI, tracer: Any, session: str, *, response_ids: bool) -> list[str]:
    """A tool call, its result (a tool span of >= 10 ms), a text answer, under one root
    span. With `response_ids`, chat spans name their completion (OpenInference
    `llm.response.id`); without, only the tool call ids the gateway minted (as smolagents'
    spans do), in GenAI semantic-convention attributes."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    ids = []
    with tracer.start_as_current_span(
        "agent run", attributes={"gen_ai.operation.name": "invoke_agent"}
    ):
        for choice in (CALL, FINAL):
            with tracer.start_as_current_span("chat") as span:
                r = await client.chat.completions.create(
                    model="agentrl-policy",
                    messages=messages,  # type: ignore[arg-type]
                    tools=TOOLS,  # type: ignore[arg-type]
                    temperature=0,
                    extra_headers={"x-agentrl-session": session},
                    extra_body=steer(choice),
                )
                msg = r.choices[0].message
                parts = [
                    {"type": "tool_call", "id": c.id, "name": c.function.name}  # type: ignore[union-attr]
                    for c in msg.tool_calls or []
                ] or [{"type": "text", "content": msg.content}]
                span.set_attributes(
                    {
                        "gen_ai.operation.name": "chat",
                        "gen_ai.input.messages": json.dumps(
                            [{"role": "user", "parts": [{"type": "text", "content": TASK}]}]
                        ),
                        "gen_ai.output.messages": json.dumps(
                            [{"role": "assistant", "parts": parts}]
                        ),
                    }
                    | ({"gen_ai.response.id": r.id} if response_ids else {})
                )
            ids.append(r.id)
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
                    await asyncio.sleep(0.02)
                    ts.set_attribute("gen_ai.tool.call.result", out)
                messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
    return ids


async def test_a_trace_at_a_control_api_in_another_process_enriches_the_gateway_episode(
    harness: Harness, other_api: str
) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="[frameworks] extra")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
    for response_ids in (True, False):
        provider = TracerProvider(resource=Resource.create({"service.name": "replica-agent"}))
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{other_api}/v1/traces"))
        )
        session = f"apart-{uuid.uuid4().hex[:8]}"
        ids = await _run(client, provider.get_tracer("t"), session, response_ids=response_ids)
        await asyncio.to_thread(provider.shutdown)  # exported before the episode ends
        ended = await harness.end(session)
        traj = await harness.trajectory(ended["trajectory_id"])
        cap = traj["metadata"]["capture"]
        assert cap["source"] == "gateway", cap
        assert len(cap.get("otlp", {}).get("trace_ids") or []) == 1, (response_ids, cap)
        assert [t["action"]["completion_id"] for t in traj["turns"]] == ids
        # chat spans' durations: each one that names its completion (without response ids,
        # only the span that answered with the gateway's tool call)
        timed = traj["turns"] if response_ids else traj["turns"][:1]
        assert all(t["action"]["duration_ms"] >= 0 for t in timed), traj["turns"]
        assert traj["turns"][0]["result"]["execution_time_ms"] >= 20  # the tool span
        holding = [
            t["trajectory_id"]
            for t in await harness.trajectories()
            if set(ids) & set(t["metadata"].get("capture", {}).get("completion_ids") or [])
        ]
        assert holding == [traj["trajectory_id"]]  # not published again by the other process
    await client.close()
    async with httpx.AsyncClient() as c:
        stats = (await c.get(f"{other_api}/v1/traces/stats")).json()
    assert stats["joined_in_another_process"] == 2, stats
    assert stats["published"] == 0 and stats["joined_after_publish"] == 0, stats
    assert harness.capture.counts.enriched == 2
