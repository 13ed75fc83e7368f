"""One agent run is one episode, published once, never lost, with honest provenance: the
gateway + OTLP join, foreign response ids, several conversations under one key, one
`user` with overlapping conversations, failed requests, an oversized episode, and the
OTLP receiver's bounds. Real nats-server, real gateway and control API over HTTP."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
import uuid
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from capture_kit import VERSION, Harness, serve, stream_docs
from openai import AsyncOpenAI
from toolkit import CALL, FINAL, SYSTEM, TASK, TOOLS, add, steer


async def ask(
    client: AsyncOpenAI,
    messages: list[dict[str, Any]],
    choice: str,
    *,
    headers: dict[str, str] | None = None,
    user: str | None = None,
    model: str = "agentrl-policy",
) -> Any:
    extra: dict[str, Any] = {"user": user} if user else {}
    return await client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        temperature=0,
        extra_headers=headers or {},
        extra_body={**steer(choice), **extra},
    )


async def loop(client: AsyncOpenAI, task: str, **kw: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """A tool call, its result, a text answer. Returns the completion ids and history."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task},
    ]
    ids = []
    for choice in (CALL, FINAL):
        r = await ask(client, messages, choice, **kw)
        ids.append(r.id)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls or []:
            args = json.loads(call.function.arguments)  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": add(**args)})
    return ids, messages


async def of_session(h: Harness, session: str) -> list[dict[str, Any]]:
    return [t for t in await h.trajectories() if t["session_id"] == session]


# ---- 1. the same episode twice -------------------------------------------------------------
async def test_a_gateway_episode_with_otlp_traces_is_published_once_and_enriched(
    harness: Harness,
) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="[frameworks] extra")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "smol-like"}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{harness.api}/v1/traces"))
    )
    tracer = provider.get_tracer("test")
    session = f"both-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    ids = []
    with tracer.start_as_current_span("agent.run", attributes={"openinference.span.kind": "AGENT"}):
        for choice in (CALL, FINAL):
            with tracer.start_as_current_span("LLM") as span:
                r = await ask(client, messages, choice, headers={"x-agentrl-session": session})
                span.set_attributes(
                    {"openinference.span.kind": "LLM", "llm.response.id": r.id}
                    | {"llm.input_messages.0.message.role": "user"}
                    | {"llm.input_messages.0.message.content": TASK}
                )
            ids.append(r.id)
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            for c in msg.tool_calls or []:
                with tracer.start_as_current_span(
                    "add",
                    attributes={"openinference.span.kind": "TOOL", "tool.name": "add"},
                ) as ts:
                    out = add(**json.loads(c.function.arguments))  # type: ignore[union-attr]
                    ts.set_attribute("output.value", out)
                    await asyncio.sleep(0.01)
                messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
    await asyncio.to_thread(provider.shutdown)  # the trace is in before the episode ends
    await client.close()
    ended = await harness.end(session)
    traj = await harness.trajectory(ended["trajectory_id"])
    cap = traj["metadata"]["capture"]
    assert cap["source"] == "gateway" and len(cap["otlp"]["trace_ids"]) == 1
    assert [t["action"]["completion_id"] for t in traj["turns"]] == ids
    assert all(t["action"]["duration_ms"] >= 0 for t in traj["turns"])  # from the LLM spans
    assert traj["turns"][0]["result"]["execution_time_ms"] >= 10  # from the tool span
    await asyncio.sleep(0.5)
    # one trajectory holds these completion ids: no second one from the trace
    holding = [
        t
        for t in await harness.trajectories()
        if set(ids) & set(t["metadata"].get("capture", {}).get("completion_ids") or [])
    ]
    assert [t["trajectory_id"] for t in holding] == [traj["trajectory_id"]]
    async with httpx.AsyncClient() as c:
        stats = (await c.get(f"{harness.api}/v1/traces/stats")).json()
    assert stats["joined_to_episodes"] == 1 and stats["published"] == 0


# ---- 2. token_exact only for this gateway's ids ---------------------------------------------
async def test_another_servers_response_ids_are_kept_apart_and_not_token_exact(
    harness: Harness,
) -> None:
    trace = os.urandom(16).hex()
    root = os.urandom(8).hex()

    def span(sid: str, parent: str, attrs: dict[str, str]) -> dict[str, Any]:
        return {
            "traceId": trace,
            "spanId": sid,
            "parentSpanId": parent,
            "name": "chat",
            "startTimeUnixNano": "1000",
            "endTimeUnixNano": "2000",
            "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
        }

    llm = {
        "gen_ai.operation.name": "chat",
        "gen_ai.response.id": "chatcmpl-from-someone-else",
        "gen_ai.response.model": "gpt-x",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": TASK}]}]
        ),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": FINAL}]}]
        ),
    }
    body = {
        "resourceSpans": [
            {"scopeSpans": [{"spans": [span(os.urandom(8).hex(), root, llm), span(root, "", {})]}]}
        ]
    }
    async with httpx.AsyncClient() as c:
        r = await c.post(f"{harness.api}/v1/traces", json=body)
    assert r.status_code == 200, r.text
    traj = await harness.trajectory(r.json()["trajectory_ids"][0])
    cap = traj["metadata"]["capture"]
    assert cap["token_exact"] is False and cap["completion_ids"] == []
    assert cap["response_ids"] == ["chatcmpl-from-someone-else"]
    action = traj["turns"][0]["action"]
    assert "completion_id" not in action and action["response_id"] == llm["gen_ai.response.id"]


# ---- 3. one run, several conversations -----------------------------------------------------
async def test_a_crews_two_tasks_and_a_retry_under_one_key_are_one_episode(
    harness: Harness,
) -> None:
    session = f"crew-{uuid.uuid4().hex[:8]}"
    hdr = {"x-agentrl-session": session}
    client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
    ids1, _ = await loop(client, TASK, headers=hdr)
    # task 2 of the crew: a fresh conversation; then an adapter's retry with another prompt
    ids2, _ = await loop(client, "Now add 4 and 4 with the add tool.", headers=hdr)
    retry = await ask(
        client, [{"role": "user", "content": "Answer in JSON: 4 + 4?"}], FINAL, headers=hdr
    )
    await client.close()
    ended = await harness.end(session, success=True)
    assert ended["turns"] == 5 and ended["threads"] == 3
    traj = await harness.trajectory(ended["trajectory_id"])
    assert [t["action"]["completion_id"] for t in traj["turns"]] == [*ids1, *ids2, retry.id]
    assert [t["thread"] for t in traj["turns"]] == [1, 1, 2, 2, 3]
    threads = traj["metadata"]["threads"]
    assert [t.get("parent") for t in threads] == [None, 1, 2]
    assert threads[1]["task"].startswith("Now add") and threads[1]["opened_by"] == "conversation"
    # each thread's tool result is its own (read within the thread)
    assert traj["turns"][2]["result"]["output"] == "5"
    assert traj["turns"][2]["observation"]["content"].startswith("Now add")
    assert traj["metadata"]["outcome"]["task_status"] == "completed_successfully"
    assert len(await of_session(harness, session)) == 1
    # feedback by key reaches the whole episode and says so
    await harness.reward_versions(traj["trajectory_id"], 1)
    r = await harness.feedback(episode_id=session, metric_name="ok", value=True)
    assert r.status_code == 202 and r.json()["trajectory_ids"] == [traj["trajectory_id"]]


# ---- 4. one `user`, two conversations ------------------------------------------------------
async def test_overlapping_conversations_of_one_user_are_two_episodes(harness: Harness) -> None:
    user = f"acct-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
    a: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    b: list[dict[str, Any]] = [{"role": "user", "content": "Add 10 and 1 with the add tool."}]
    ra = await ask(client, a, CALL, user=user)
    rb = await ask(
        client, b, json.dumps({"name": "add", "arguments": {"a": 10, "b": 1}}), user=user
    )
    for hist, r in ((a, ra), (b, rb)):  # interleaved: each sends back its own tool result
        msg = r.choices[0].message
        hist.append(msg.model_dump(exclude_none=True))
        call = msg.tool_calls[0]  # type: ignore[index]
        hist.append(
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": add(**json.loads(call.function.arguments)),
            }  # type: ignore[union-attr]
        )
    fb = await ask(client, b, FINAL, user=user)
    fa = await ask(client, a, FINAL, user=user)
    await client.close()
    ea = await harness.end(fa.id)  # any completion id of an episode names it
    eb = await harness.end(rb.id)
    assert ea["trajectory_id"] != eb["trajectory_id"]
    ta = await harness.trajectory(ea["trajectory_id"])
    tb = await harness.trajectory(eb["trajectory_id"])
    assert [t["action"]["completion_id"] for t in ta["turns"]] == [ra.id, fa.id]
    assert [t["action"]["completion_id"] for t in tb["turns"]] == [rb.id, fb.id]
    assert ta["turns"][0]["result"]["output"] == "5" and tb["turns"][0]["result"]["output"] == "11"
    assert ta["session_id"] == ra.id and tb["session_id"] == rb.id


def test_an_episode_belongs_to_the_api_key_that_opened_it() -> None:
    from agentrl.capture.service import CaptureService, owner_of

    svc = CaptureService(None)
    svc.keyed = lambda: True
    gen = SimpleNamespace(content="hi", tool_calls=None, prompt_tokens=1, completion_tokens=1)
    body = SimpleNamespace(messages=[{"role": "user", "content": "x"}], user=None, episode_id=None)
    alice = {"authorization": "Bearer alice", "x-agentrl-session": "s"}
    bob = {"authorization": "Bearer bob", "x-agentrl-session": "s"}
    svc.observe(alice, body, gen, "c1", "v")
    svc.observe(bob, body, gen, "c2", "v")
    assert len(svc.book.open) == 2  # one session key, two owners: two episodes
    assert svc.book.find("s", owner_of(alice)) != svc.book.find("s", owner_of(bob))
    assert svc.book.find("c1", owner_of(bob)) is None  # bob cannot end alice's by her id
    assert svc.book.find("s", None) is None


# ---- 5. a failed request is a failed turn --------------------------------------------------
async def test_a_timed_out_request_is_a_failed_turn_and_end_tells_the_truth(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi import FastAPI

    from agentrl.serving.backends import UpstreamBackend

    slow = FastAPI()
    # the backend answers only when the test is done: uvicorn's shutdown waits for the
    # requests in flight, and a plain 30 s sleep held the test 30 s after its checks
    done = asyncio.Event()

    @slow.post("/v1/chat/completions")
    async def never() -> dict[str, Any]:
        await asyncio.wait_for(done.wait(), 30)
        return {}

    server, task, port = await serve(slow)
    state = harness.state
    state.backends["p-slow"] = UpstreamBackend(f"http://127.0.0.1:{port}/v1", timeout_s=30)
    state.timeout_s = 0.5
    client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
    try:
        session = f"slow-{uuid.uuid4().hex[:8]}"
        hdr = {"x-agentrl-session": session}
        only = f"only-{uuid.uuid4().hex[:8]}"
        msgs: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
        state.timeout_s = 60.0
        ok = await ask(client, msgs, CALL, headers=hdr)
        msg = ok.choices[0].message
        msgs += [
            msg.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "5"},  # type: ignore[index]
        ]
        state.timeout_s = 0.5
        with pytest.raises(Exception, match="did not answer in time"):
            await ask(client, msgs, FINAL, headers=hdr, model="p-slow")
        with pytest.raises(Exception, match="did not answer in time"):
            await ask(
                client,
                [{"role": "user", "content": "hi"}],
                FINAL,
                headers={"x-agentrl-session": only},
                model="p-slow",
            )
    finally:
        await client.close()
        done.set()
        server.should_exit = True
        await task
    assert any(
        "recorded as a failed turn" in r.getMessage() and "504" in r.getMessage()
        for r in caplog.records
    )
    ended = await harness.end(session)
    assert ended["turns"] == 2 and ended["failed_turns"] == 1
    traj = await harness.trajectory(ended["trajectory_id"])
    last = traj["turns"][-1]
    assert last["result"]["success"] is False and "504" in last["result"]["error"]
    assert last["action"]["failed"] is True and "completion_id" not in last["action"]
    assert traj["metadata"]["capture"]["failed_turns"] == 1
    assert traj["metadata"]["capture"]["completion_ids"] == [ok.id]
    lone = await harness.end(only)  # an episode whose only request failed is not lost
    assert lone["turns"] == 1 and lone["failed_turns"] == 1


# ---- 6. the outbox never blocks --------------------------------------------------------------
def _served(svc: Any, session: str, text: str, n: int = 1) -> None:
    """`n` served requests of episode `session` straight into the service's book."""
    from datetime import UTC, datetime

    msgs: list[dict[str, Any]] = [{"role": "user", "content": text}]
    for i in range(n):
        svc.book.observe(
            session,
            msgs,
            {"content": "ok", "tool_calls": None},
            f"chatcmpl-{session}-{i}",
            VERSION,
            now=time.monotonic(),
            at=datetime.now(UTC),
        )
        msgs = [*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": text}]


async def test_an_oversized_episode_is_trimmed_or_dead_lettered_and_later_ones_flow(
    tmp_path: Any,
) -> None:
    from agentrl.bus import Bus, EmbeddedNats
    from agentrl.capture.episodes import Closed
    from agentrl.capture.service import CaptureService
    from agentrl.capture.settings import CaptureSettings

    with EmbeddedNats(data_dir=tmp_path / "nats", max_payload=256 * 1024) as srv:
        bus = await Bus.connect(srv.url, name="outbox-test")
        try:
            await bus.ensure_streams()
            svc = CaptureService(bus, CaptureSettings(max_turns=4096))
            _served(svc, "huge", "x" * 600_000)  # one 600 kB message: trimmed to fit
            _served(svc, "long", "y" * 64, n=3000)  # 3,000 turns: cannot fit, dead-lettered
            for k in ("huge", "long"):  # closed, waiting in the outbox, in this order
                svc._queue(Closed(svc.book.end(k), "ended"), None, None)  # type: ignore[arg-type]
            for i in range(5):
                _served(svc, f"after-{i}", f"task {i}")
                svc._queue(Closed(svc.book.end(f"after-{i}"), "ended"), None, None)  # type: ignore[arg-type]
            await asyncio.wait_for(svc.flush(), 60)
            assert not svc.outbox and svc.outbox_bytes == 0
            docs = await stream_docs(bus, "RL_TRAJECTORIES")
            sessions = [d["session_id"] for d in docs]
            assert sessions == ["huge", *[f"after-{i}" for i in range(5)]]
            trimmed = docs[0]["metadata"]["capture"]["trimmed"]
            assert trimmed["original_bytes"] > 600_000
            assert "bytes cut]" in docs[0]["task_context"]["instructions"]
            dlq = [json.loads((await bus.js.get_msg("RL_DLQ", 1)).data)]
            assert dlq[0]["error_kind"] == "payload_too_large"
            assert dlq[0]["episode_id"] == "long" and "max_payload" in dlq[0]["error"]
            assert svc.counts.trimmed == 1 and svc.counts.dead_lettered == 1
        finally:
            await bus.close()


def test_closed_episodes_waiting_to_be_published_count_against_the_byte_budget() -> None:
    from agentrl.capture.episodes import Closed
    from agentrl.capture.service import CaptureService
    from agentrl.capture.settings import CaptureSettings

    svc = CaptureService(None, CaptureSettings(max_bytes=64 * 1024))  # NATS away: no flush
    for i in range(100):
        _served(svc, f"s{i}", "z" * 2000)
        svc._queue(Closed(svc.book.end(f"s{i}"), "ended"), None, None)  # type: ignore[arg-type]
        assert svc.outbox_bytes + svc.book.bytes <= 64 * 1024
    assert svc.counts.outbox_dropped > 0 and svc.book.reserved == svc.outbox_bytes


# ---- 7. OTLP ingest bounds -------------------------------------------------------------------
async def test_otlp_bodies_are_bounded_as_they_stream_and_as_they_inflate(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTRL_CAPTURE_OTLP_MAX_BODY_BYTES", str(2**20))
    monkeypatch.setenv("AGENTRL_CAPTURE_OTLP_MAX_DECODED_BYTES", str(4 * 2**20))
    url = f"{harness.api}/v1/traces"
    bomb = gzip.compress(b"\0" * (64 * 2**20), compresslevel=9)  # ~64 kB -> 64 MiB
    assert len(bomb) < 2**20

    async def chunks() -> Any:  # no content-length: read as it streams
        for _ in range(40):
            yield b"x" * 65536

    async with httpx.AsyncClient() as c:
        r1 = await c.post(
            url,
            content=bomb,
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        r2 = await c.post(url, content=chunks(), headers={"content-type": "application/json"})
        r3 = await c.post(
            url, content=b"x" * (2**20 + 10), headers={"content-type": "application/json"}
        )
        stats = (await c.get(f"{url}/stats")).json()
    assert r1.status_code == 413 and "inflates to over" in r1.text
    assert r2.status_code == 413 and r3.status_code == 413 and "smaller batches" in r2.text
    assert stats["too_large"] == 3


def test_the_trace_book_has_a_byte_budget_and_attribute_caps() -> None:
    from agentrl.capture.api import TraceBook
    from agentrl.capture.otlp import Span

    book = TraceBook(100, 10_000, 30.0, max_bytes=100_000, max_attrs=8, max_attr_bytes=4096)
    done = []
    for i in range(50):
        attrs = {"big": "q" * 50_000} | {f"a{j}": "v" for j in range(20)}
        span = Span(os.urandom(16).hex(), os.urandom(8).hex(), "ff" * 8, "s", 0, 1, attrs)
        done += book.add([span], now=float(i))
        assert book.bytes <= 100_000
    kept = next(iter(book.traces.values())).spans[0]
    assert len(kept.attrs) == 8 and book.counts["attrs_capped"] >= 50 * 13
    big = [v for v in kept.attrs.values() if len(v) > 100]
    assert all(len(v.encode()) <= 4096 + 64 for v in big)
    assert done and book.counts["traces_evicted"] == len(done)


@pytest.mark.capture(otlp_idle_s=0.3)
async def test_a_trace_without_its_root_is_published_by_the_timer(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTRL_CAPTURE_OTLP_IDLE_S", "0.3")
    trace = os.urandom(16).hex()
    llm = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": TASK}]}]
        ),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": FINAL}]}]
        ),
    }
    span = {
        "traceId": trace,
        "spanId": os.urandom(8).hex(),
        "parentSpanId": os.urandom(8).hex(),  # its root never comes
        "name": "chat",
        "startTimeUnixNano": "1000",
        "endTimeUnixNano": "2000",
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in llm.items()],
    }
    async with httpx.AsyncClient() as c:
        r = await c.post(
            f"{harness.api}/v1/traces",
            json={"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]},
        )
    assert r.status_code == 200 and r.json()["trajectory_ids"] == []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # no further request: the timer publishes it
        found = [
            t
            for t in await harness.trajectories()
            if t["metadata"].get("capture", {}).get("trace_id") == trace
        ]
        if found:
            break
        await asyncio.sleep(0.1)
    assert found and found[0]["metadata"]["capture"]["root_span_missing"] is True
