"""The normal turn against agentrl's real gateway: Agent Zero streams through LiteLLM and
closes the stream at the first complete JSON tool request (`aclose()`), so LiteLLM never
reports the call. Every turn must still carry the gateway's completion id (the key of its
completion log) and the version that served."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from typing import Any

import pytest
from a0_kit import Checkout, recording, stream_payloads, trajectories_of
from a0_standins import parse_tool_request

from agentrl.bus import Bus
from agentrl.bus.server import free_port
from agentrl.serving.backends import UpstreamBackend
from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app

# Agent Zero's own client library, imported where it is called: its import is ~4 s of CPU
# that every pytest process paid while collecting this module
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("litellm") is None, reason="litellm (Agent Zero's client)"
)


class LiteLLMChatModel:
    """Agent Zero's LiteLLMChatWrapper.unified_call as models.py does it (2d95cd9): LiteLLM
    `acompletion(stream=True, **kwargs)`, chunks read until the answer holds a complete
    JSON tool request, then `aclose()`."""

    def __init__(self, iteration: dict[str, Any], api_base: str) -> None:
        self.kwargs = {"api_base": api_base, "api_key": "sk-a0"}
        self.closed_early = False
        self.chunk_ids: set[str] = set()  # the ids in the stream's body

    async def unified_call(self, messages: Any = None, **kwargs: Any) -> tuple[str, str]:
        import litellm

        call_kwargs = {**self.kwargs, **kwargs}
        stream = await litellm.acompletion(
            model="openai/agentrl-policy",
            messages=[{"role": "user", "content": "go"}],
            stream=True,
            **call_kwargs,
        )
        full = ""
        try:
            async for chunk in stream:
                self.chunk_ids.add(chunk.id)
                choices = chunk.get("choices") or [{}]  # the usage chunk has none
                full += (choices[0].get("delta") or {}).get("content") or ""
                request = parse_tool_request(full)
                if request is not None and request.get("tool_name"):
                    self.closed_early = True
                    break
        finally:
            if self.closed_early:
                await stream.aclose()
        return full, ""


def streaming_upstream(texts: list[str]) -> Any:
    """An OpenAI-compatible server that streams `texts` in order, a few characters a chunk,
    then the finish chunk and the usage chunk (what a vLLM answers)."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    answers = iter(texts)

    async def chat(request: Any) -> StreamingResponse:
        body = await request.json()
        text = next(answers)

        def sse(choices: list[Any], **extra: Any) -> str:
            chunk = {"id": "up", "object": "chat.completion.chunk", "created": 0}
            chunk.update(model=body["model"], choices=choices, **extra)
            return f"data: {json.dumps(chunk)}\n\n"

        async def events() -> Any:
            for i in range(0, len(text), 8):
                yield sse([{"index": 0, "delta": {"content": text[i : i + 8]}}])
            yield sse([{"index": 0, "delta": {}, "finish_reason": "stop"}])
            usage = {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}
            yield sse([], usage=usage)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


async def serve(app: Any) -> tuple[Any, asyncio.Task[None], int]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, port


async def test_an_early_closed_stream_still_names_version_and_completion_id(
    checkout: Checkout, a0_nats: Any
) -> None:
    rec = recording("main_with_tools")
    up_server, up_task, up_port = await serve(
        streaming_upstream([it["response"] for it in rec["iterations"]])
    )
    bus = await Bus.connect(a0_nats.url)
    await bus.ensure_streams()
    log = CompletionLog(bus)
    stop = asyncio.Event()
    log_task = asyncio.create_task(log.run(stop))
    from agentrl.capture.service import CaptureService

    capture = CaptureService(bus)  # the gateway's own capture: Agent Zero opts out of it
    state = GatewayState("agentrl-policy", completion_log=log, timeout_s=30.0, capture=capture)
    upstream = f"http://127.0.0.1:{up_port}/v1"
    state.backends["agentrl-policy-v3"] = UpstreamBackend(upstream, timeout_s=10)
    state.set_split({"agentrl-policy-v3": 100.0}, ["agentrl-policy-v3"])
    server, task, port = await serve(create_gateway_app(state))
    gateway = f"http://127.0.0.1:{port}/v1"
    models: list[LiteLLMChatModel] = []

    def factory(iteration: dict[str, Any], api_base: str) -> LiteLLMChatModel:
        models.append(LiteLLMChatModel(iteration, gateway))
        return models[-1]

    try:
        checkout.write_config(gateway_url=gateway)
        checkout.driver.model_factory = factory
        agent, answer = await checkout.run(rec)
        assert answer == "The sum of [1, 2, 3] is 6."
        assert [m.closed_early for m in models] == [True, True]  # the normal turn
        (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    finally:
        server.should_exit = up_server.should_exit = True
        await task
        await up_task
        stop.set()
        await log_task
        await bus.close()
    turns = payload["turns"]
    assert [t["action"]["model"] for t in turns] == ["agentrl-policy-v3"] * 2
    ids = [t["action"]["completion_id"] for t in turns]
    assert len(set(ids)) == 2 and all(i.startswith("chatcmpl") for i in ids), ids
    # the gateway's own ids: the ones in the body of each stream it served
    assert [m.chunk_ids for m in models] == [{i} for i in ids]
    assert payload["metadata"]["model"] == "agentrl-policy-v3"
    # training finds each turn's tokens by that id: every early-closed stream has its row
    rows = [
        r
        for r in await stream_payloads(a0_nats.url, "agent.rl.completion.v1")
        if r["completion_id"] in ids
    ]
    assert sorted(r["completion_id"] for r in rows) == sorted(ids)
    assert {r["model"] for r in rows} == {"agentrl-policy-v3"}
    # the plugin publishes the monologue itself: the gateway assembled no copy of it
    assert capture.counts.opted_out == 2 and capture.stats()["open"] == 0, capture.stats()
