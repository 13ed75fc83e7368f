"""Issue 54: a streamed request through an upstream backend goes over the gateway's own
keep-alive pool (httpx's pool cost ~9 ms of CPU per streamed request at 200 requests/s), and
the events that arrive together leave together. What must hold: events split anywhere across
reads are reassembled; an upstream that dies mid-stream or sends a chunk that is not JSON is
an in-band 502 (counted as the version's error) and its connection is not reused; an error
status is a 502 before the stream; a client that closes early closes the upstream connection
and the completion log keeps what it was sent. Real HTTP: a scripted upstream on a raw
socket (to control how its bytes are cut), the gateway under uvicorn as `agentrl up` serves
it, raw-socket and httpx clients."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import orjson
import pytest

from agentrl.core.httpserve import serve_http
from agentrl.serving.backends import UpstreamBackend
from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app
from deploy_helpers import free_port
from raw_http import read_json_request


def _event(delta: dict[str, Any] | None, finish: str | None = None, usage: bool = False) -> bytes:
    doc: dict[str, Any] = {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "up",
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    if usage:
        doc["usage"] = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    return b"data: " + orjson.dumps(doc) + b"\r\n\r\n"


EVENTS = [
    _event({"role": "assistant", "content": ""}),
    _event({"content": "Hel"}),
    _event({"content": "lo"}),
    _event({}, "stop"),
    _event(None, usage=True),
    b"data: [DONE]\r\n\r\n",
]
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Upstream:
    """A chat-completions server on a raw socket; the requested model names the script."""

    def __init__(self) -> None:
        self.connections = 0
        self.closed = 0  # connections whose client (the gateway) closed them
        self.release = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                body = await read_json_request(reader)
                if not await self.answer(body["model"], reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed += 1
        finally:
            writer.close()

    async def answer(
        self, script: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False: close the connection after it."""
        data = b"".join(EVENTS)
        if script == "one-write":  # head, every event and the end in one write
            writer.write(HEAD + _chunked(data) + b"0\r\n\r\n")
        elif script == "split":  # cut inside lines, inside "\r\n", inside chunk frames
            wire = HEAD + b"".join(_chunked(e) for e in EVENTS) + b"0\r\n\r\n"
            for i in range(0, len(wire), 37):
                writer.write(wire[i : i + 37])
                await writer.drain()
                await asyncio.sleep(0.002)
        elif script == "truncated":  # dies after two events
            writer.write(HEAD + _chunked(b"".join(EVENTS[:2])))
            await writer.drain()
            return False
        elif script == "notjson":
            writer.write(HEAD + _chunked(EVENTS[0] + b"data: {not json\r\n\r\n"))
            await writer.drain()
            await asyncio.sleep(30)  # (the gateway closes it)
        elif script == "error":
            body = b'{"error": {"message": "scripted overload"}}'
            writer.write(
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
        elif script == "silent":  # no answer at all (the gateway gives up and closes)
            await reader.read(1)
            self.closed += 1
            return False
        elif script == "slow":  # one event, then nothing until the gateway lets go
            writer.write(HEAD + _chunked(EVENTS[0] + EVENTS[1]))
            await writer.drain()
            await reader.read(1)  # b"": the gateway closed the connection
            self.closed += 1
            return False
        await writer.drain()
        return True


@pytest.fixture(scope="module")
async def gw():
    up = Upstream()
    server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
    up_port = server.sockets[0].getsockname()[1]
    log = CompletionLog(bus=None)
    state = GatewayState("stream-policy", completion_log=log, timeout_s=10.0)
    backend = UpstreamBackend(f"http://127.0.0.1:{up_port}/v1", timeout_s=10.0)
    for script in ("one-write", "split", "truncated", "notjson", "error", "slow"):
        state.backends[script] = backend
    quick = UpstreamBackend(f"http://127.0.0.1:{up_port}/v1", timeout_s=0.5)
    state.backends["silent"] = quick
    state.set_split({"one-write": 100.0}, ["one-write"])
    port = free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve_http(create_gateway_app(state), "127.0.0.1", port, stop, "gateway")
    )
    async with httpx.AsyncClient() as c:
        for _ in range(200):
            try:
                await c.get(f"http://127.0.0.1:{port}/v1/models")
                break
            except httpx.TransportError:
                await asyncio.sleep(0.02)
    try:
        yield state, up, backend, port
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await backend.close()
        await quick.close()
        server.close()


def _request(model: str) -> bytes:
    body = json.dumps(
        {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


async def _frames(port: int, model: str) -> tuple[bytes, list[bytes]]:
    """(head, the body's chunk frames as they came) of one streamed request on a raw socket."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_request(model))
        head = await reader.readuntil(b"\r\n\r\n")
        assert b" 200 " in head.split(b"\r\n")[0], head
        frames = []
        while True:
            size = int(await reader.readuntil(b"\r\n"), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return head, frames
            frames.append((await reader.readexactly(size + 2))[:-2])
    finally:
        writer.close()


def _datas(frames: list[bytes]) -> list[Any]:
    out = []
    for line in b"".join(frames).split(b"\n"):
        if line.startswith(b"data: "):
            out.append("[DONE]" if line[6:] == b"[DONE]" else json.loads(line[6:]))
    return out


async def test_events_that_arrive_together_leave_together_and_reuse_one_connection(
    gw: Any,
) -> None:
    state, up, backend, port = gw
    before = up.connections
    for _ in range(3):
        head, frames = await _frames(port, "stream-policy")
        assert b" 200 " in head.split(b"\r\n")[0] and b"x-agentrl-model-version: one-write" in head
        # the five events the upstream sent in one write: one frame; [DONE] with the end
        assert len(frames) == 2, frames
        docs = _datas(frames)
        assert docs[-1] == "[DONE]" and len(docs) == 6
        cid = head.split(b"x-agentrl-completion-id: ")[1].split(b"\r\n")[0].decode()
        assert {d["id"] for d in docs[:-1]} == {cid}
        assert {d["model"] for d in docs[:-1]} == {"one-write"}
        assert "".join(c["delta"].get("content", "") for d in docs[:-1] for c in d["choices"]) == (
            "Hello"
        )
        row = orjson.loads(state.completion_log.queue[-1][1])
        assert row["completion_id"] == cid and row["finish_reason"] == "stop"
    assert up.connections - before <= 1 and len(backend.pool.idle) == 1


async def test_events_cut_anywhere_across_reads_are_reassembled(gw: Any) -> None:
    state, _up, _backend, port = gw
    async with httpx.AsyncClient() as c:
        body = {"model": "split", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        body["stream_options"] = {"include_usage": True}
        r = await c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
    assert r.status_code == 200
    docs = [
        "[DONE]" if line == "data: [DONE]" else json.loads(line[6:])
        for line in r.text.split("\n")
        if line.startswith("data: ")
    ]
    assert len(docs) == 6 and docs[-1] == "[DONE]"
    assert (
        "".join(c["delta"].get("content", "") for d in docs[:-1] for c in d["choices"]) == "Hello"
    )
    assert docs[-2]["usage"]["completion_tokens"] == 2
    assert state.stats_for("split", pinned=True).errors == 0


@pytest.mark.parametrize(
    "script, why", [("truncated", "closed in the middle"), ("notjson", "not JSON")]
)
async def test_an_upstream_that_fails_mid_stream_is_an_in_band_502(
    gw: Any, script: str, why: str
) -> None:
    state, _up, backend, port = gw
    errors = state.stats_for(script, pinned=True).errors
    head, frames = await _frames(port, script)
    assert b" 200 " in head.split(b"\r\n")[0]
    docs = _datas(frames)
    assert docs[-1] == "[DONE]"
    error = docs[-2]["error"]
    assert error["code"] == "502" and why in error["message"], error
    assert state.stats_for(script, pinned=True).errors == errors + 1
    # the failed connection is not kept for the next request
    assert all(not c.reader.at_eof() for c in backend.pool.idle)


@pytest.mark.parametrize(
    "script, status, why",
    [("error", 502, "scripted overload"), ("silent", 504, "timed out after 0.5s")],
)
async def test_an_upstream_error_or_silence_is_answered_before_the_stream(
    gw: Any, script: str, status: int, why: str
) -> None:
    state, up, _backend, port = gw
    closed = up.closed
    async with httpx.AsyncClient() as c:
        body = {"model": script, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        r = await c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
    assert r.status_code == status
    assert why in r.json()["error"]["message"]
    assert state.stats_for(script, pinned=True).errors >= 1
    if script == "silent":  # the connection it gave up on is closed, not pooled
        for _ in range(100):
            if up.closed > closed:
                break
            await asyncio.sleep(0.02)
        assert up.closed == closed + 1


async def test_a_silent_upstream_is_a_504_by_the_earlier_deadline_non_streamed(gw: Any) -> None:
    """Issue 54: the gateway sets no timer of its own when the upstream backend's deadline
    (0.5 s here) comes first; a shorter gateway timeout still applies. Either way a silent
    upstream is a 504 counted as the version's timeout, and its connection is closed."""
    state, up, _backend, port = gw
    body = {"model": "silent", "messages": [{"role": "user", "content": "hi"}]}
    stats = state.stats_for("silent", pinned=True)
    for gateway_s, why in ((10.0, "timed out after 0.5s"), (0.2, "did not answer in time")):
        state.timeout_s, timeouts, closed = gateway_s, stats.timeouts, up.closed
        try:
            async with httpx.AsyncClient() as c:
                r = await c.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
        finally:
            state.timeout_s = 10.0
        assert r.status_code == 504 and why in r.json()["error"]["message"], r.text
        assert stats.timeouts == timeouts + 1
        for _ in range(100):
            if up.closed > closed:
                break
            await asyncio.sleep(0.02)
        assert up.closed == closed + 1


async def test_a_client_that_closes_early_closes_the_upstream_connection(gw: Any) -> None:
    state, up, backend, port = gw
    closed, abandoned = up.closed, state.abandoned
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request("slow"))
    head = await reader.readuntil(b"\r\n\r\n")
    cid = head.split(b"x-agentrl-completion-id: ")[1].split(b"\r\n")[0].decode()
    size = int(await reader.readuntil(b"\r\n"), 16)
    assert b"Hel" in await reader.readexactly(size)
    writer.close()
    for _ in range(250):  # the upstream sees its connection closed, within seconds
        if up.closed > closed and state.abandoned > abandoned:
            break
        await asyncio.sleep(0.02)
    assert up.closed == closed + 1 and state.abandoned == abandoned + 1
    assert all(not c.reader.at_eof() for c in backend.pool.idle)
    rows = [orjson.loads(m[1]) for m in state.completion_log.queue]
    row = next(r for r in rows if r["completion_id"] == cid)
    assert row["finish_reason"] == "cancelled"
