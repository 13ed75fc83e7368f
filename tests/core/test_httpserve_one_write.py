"""Issue 54: the HTTP servers of `agentrl up` (httpserve) send a response's head and body in
one write: uvicorn writes them separately, and each write was a `send` syscall and a wake-up
of the client (the gateway's socket writes were a fifth of its CPU at 1,000 requests/s).

A real asyncio transport over a real socket pair: what the peer can read after each step.
Through a real uvicorn server: answers, streams (the head still goes out at once when the body
is late) and connection-close answers arrive whole.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest

from agentrl.bus.server import free_port
from agentrl.core.httpserve import _OneWriteTransport, serve_http

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


def _readable(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return b""


async def _pair() -> tuple[Any, socket.socket]:
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    return transport, peer


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_the_head_waits_for_its_body_and_both_leave_together() -> None:
    transport, peer = await _pair()
    try:
        t = _OneWriteTransport(transport)
        t.write(HEAD)
        assert _readable(peer) == b""  # held: uvicorn's body write follows in this step
        t.write(b"ok")
        time.sleep(0.05)
        assert _readable(peer) == HEAD + b"ok"
        await _settle()  # the fallback flush finds nothing left
        assert _readable(peer) == b""
    finally:
        transport.close()
        peer.close()


async def test_a_head_without_a_body_in_the_same_step_goes_out_on_the_next_turn() -> None:
    transport, peer = await _pair()
    try:
        t = _OneWriteTransport(transport)
        t.write(HEAD)
        await _settle()
        time.sleep(0.05)
        assert _readable(peer) == HEAD
        t.write(b"data: 1\n\n")  # a stream's chunks pass straight through
        time.sleep(0.05)
        assert _readable(peer) == b"data: 1\n\n"
    finally:
        transport.close()
        peer.close()


async def test_closing_sends_a_held_head_first() -> None:
    transport, peer = await _pair()
    t = _OneWriteTransport(transport)
    t.write(HEAD)
    t.close()
    await _settle()
    time.sleep(0.05)
    got = b""
    for _ in range(20):
        chunk = _readable(peer)
        got += chunk
        if got == HEAD:
            break
        await asyncio.sleep(0.01)
    peer.setblocking(True)
    peer.settimeout(2)
    assert got + peer.recv(10) == HEAD  # then EOF
    peer.close()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow-stream":  # the head now, the body a while later
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one ", b"two"):
            await asyncio.sleep(1.0)
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    headers = [(b"content-length", b"2")]
    if scope["path"] == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture()
async def server() -> Any:
    port = free_port()
    stop = asyncio.Event()
    task = asyncio.create_task(serve_http(app, "127.0.0.1", port, stop, "test server"))
    for _ in range(200):
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            break
        except OSError:
            await asyncio.sleep(0.05)
    yield port
    stop.set()
    await task


async def test_answers_through_uvicorn_arrive_whole(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    try:
        for _ in range(3):  # keep-alive: one connection, several answers
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 OK")
            assert await asyncio.wait_for(reader.readexactly(2), 5) == b"ok"
        writer.write(b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)  # to EOF: the server closed
        assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"\r\n\r\nok")
    finally:
        writer.close()


async def test_a_streams_head_is_not_held_for_its_late_body(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    try:
        writer.write(b"GET /slow-stream HTTP/1.1\r\nHost: x\r\n\r\n")
        t = time.monotonic()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        took = time.monotonic() - t
        assert b"transfer-encoding: chunked" in head
        assert took < 0.8, f"the head waited {took:.2f} s for the body"
        rest = b""
        while not rest.endswith(b"0\r\n\r\n"):
            rest += await asyncio.wait_for(reader.read(1024), 5)
        assert b"one " in rest and b"two" in rest
    finally:
        writer.close()
