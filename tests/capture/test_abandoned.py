"""A request its client abandons (HTTP 499: the client disconnects before the answer, or
closes a stream before its end) is a failed turn of its episode, with the reason, never a
turn that silently goes missing. A real openai SDK client disconnects from the real
gateway; the model behind it is a real HTTP server that is slow (it stalls after its
first chunk), so the disconnect always comes first."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from capture_kit import Harness, serve
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from openai import AsyncOpenAI
from toolkit import TASK


def stalling_model() -> FastAPI:
    """An OpenAI-compatible server that answers a stream's first chunk, then stalls (and
    never answers a plain request), until its client goes."""
    app = FastAPI()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        body = await request.json()
        if not body.get("stream"):
            for _ in range(300):
                if await request.is_disconnected():
                    return {}
                await asyncio.sleep(0.1)
            return {}

        async def events() -> AsyncIterator[bytes]:
            first = {
                "id": "chatcmpl-upstream",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "slow",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let"}}],
            }
            yield b"data: " + json.dumps(first).encode() + b"\n\n"
            for _ in range(300):
                await asyncio.sleep(0.1)
                yield b": still thinking\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


async def failed_turns(h: Harness, session: str, want: int, timeout: float = 20.0) -> int:
    """The failed turns of open episode `session` once there are `want` of them."""
    deadline = time.monotonic() + timeout
    while True:
        eps = [ep for ep in h.capture.book.open.values() if ep.episode_id == session]
        got = sum(ep.failed for ep in eps)
        if got >= want or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)


async def test_a_client_that_disconnects_mid_stream_or_before_the_answer_is_a_failed_turn(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    from agentrl.serving.backends import UpstreamBackend

    server, task, port = await serve(stalling_model())
    harness.state.backends["p-slow"] = UpstreamBackend(f"http://127.0.0.1:{port}/v1", timeout_s=60)
    session = f"gone-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(
        base_url=harness.base_url,
        api_key="unused",
        max_retries=0,
        default_headers={"x-agentrl-session": session},
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    abandoned = harness.state.abandoned
    try:
        # 1. a stream closed after its first chunk
        stream = await client.chat.completions.create(
            model="p-slow",
            messages=messages,  # type: ignore[arg-type]
            stream=True,
        )
        async for chunk in stream:
            assert chunk.choices[0].delta.content == "Let"
            break
        await stream.close()
        assert await failed_turns(harness, session, 1) == 1
        # 2. a plain request whose client gives up (its timeout) before the answer
        with pytest.raises(openai.APITimeoutError):
            await client.with_options(timeout=1.0).chat.completions.create(
                model="p-slow",
                messages=messages,  # type: ignore[arg-type]
            )
        assert await failed_turns(harness, session, 2) == 2
    finally:
        await client.close()
        server.should_exit = True
        await asyncio.wait_for(task, 30)
    assert harness.state.abandoned == abandoned + 2
    assert sum("recorded as a failed turn" in r.getMessage() for r in caplog.records) == 2
    ended = await harness.end(session)
    assert ended["turns"] == 2 and ended["failed_turns"] == 2, ended
    traj = await harness.trajectory(ended["trajectory_id"])
    errors = [t["result"]["error"] for t in traj["turns"]]
    assert errors[0].startswith("499: the client closed the stream before its end"), errors
    assert errors[1] == "499: the client disconnected before the answer was ready", errors
    assert all(t["action"]["failed"] is True for t in traj["turns"])
    assert traj["metadata"]["capture"]["failed_turns"] == 2
