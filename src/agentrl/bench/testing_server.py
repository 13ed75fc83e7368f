"""A scripted OpenAI-compatible chat server on 127.0.0.1, for tests and dry runs.

It speaks the real wire format (`POST /v1/chat/completions`, `GET /v1/models`) so clients
are exercised through the official `openai` SDK and real HTTP: content, tool calls,
log-probs, usage, error statuses and slow answers are all scriptable. Every request body
is recorded in `server.requests`.

    with ScriptedOpenAIServer([ScriptedReply(content="hi")]) as server:
        client = AsyncOpenAI(base_url=server.base_url, api_key="x")
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


@dataclass
class ScriptedReply:
    """One answer. `status` != 200 answers with an OpenAI-style error body instead;
    `delay` seconds are slept first (to provoke client timeouts). `logprobs` overrides the
    generated per-token log-probs (one per token of `content` split on whitespace runs)."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    status: int = 200
    delay: float = 0.0
    logprobs: list[float] | None = None
    logprob_tokens: list[str] | None = None  # the tokens `logprobs` belong to, if not `content`'s
    finish_reason: str | None = None
    # Per token, alternatives -> log-prob (OpenAI's `top_logprobs`, cut to the request's n).
    top_logprobs: list[dict[str, float]] | None = None


Responder = Callable[[dict[str, Any]], "ScriptedReply | Awaitable[ScriptedReply]"]
_TOKEN = re.compile(r"\s*\S+|\s+")


def tool_call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """A wire-format tool call, for scripting replies."""
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:8]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text) or [text]


def guided_choices(body: dict[str, Any]) -> list[str] | None:
    """vLLM's `guided_choice` from a request body: a non-empty list of distinct strings."""
    gc = body.get("guided_choice")
    if gc is None:
        return None
    if (
        not isinstance(gc, list)
        or not gc
        or not all(isinstance(c, str) and c for c in gc)
        or len(set(gc)) != len(gc)
    ):
        raise ValueError("guided_choice must be a non-empty list of distinct non-empty strings")
    return list(gc)


def choice_responder(
    model: Any, tokenizer: Any, *, temperature: float = 0.0, seed: int | None = None
) -> Responder:
    """Answer `guided_choice` requests like vLLM: score each choice as the whole answer
    under a local HF model (`agentrl.llm.choices.score_choices`), pick the most likely one
    (temperature 0) or sample from softmax(logp / T), and return the choice's renormalised
    log-prob with every choice in `top_logprobs`. Requests without guided_choice get 400."""
    import math
    import random

    rng = random.Random(seed)

    def respond(body: dict[str, Any]) -> ScriptedReply:
        from agentrl.llm.choices import score_choices

        choices = guided_choices(body)
        if choices is None:
            return ScriptedReply(status=400, content="this server answers guided_choice only")
        logps = score_choices(model, tokenizer, [body["messages"]], choices)[0]
        t = float(body.get("temperature", temperature) or 0.0)
        if t <= 0:
            k = max(range(len(choices)), key=lambda i: logps[i])
            pol = logps
        else:
            z = [lp / t for lp in logps]
            top = max(z)
            norm = top + math.log(sum(math.exp(v - top) for v in z))
            pol = [v - norm for v in z]
            k = rng.choices(range(len(choices)), weights=[math.exp(v) for v in pol])[0]
        return ScriptedReply(
            content=choices[k],
            logprobs=[pol[k]],
            logprob_tokens=[choices[k]],
            top_logprobs=[dict(zip(choices, pol, strict=True))],
        )

    return respond


def policy_responder(policy: Any) -> Responder:
    """Serve any AgentPolicy over HTTP: each request's messages and tools go to
    `policy.get_action`, its raw output comes back as the reply with its log-probs.

    With an `HFAgentPolicy`, concurrent HTTP requests are batched by its queue, so this is a
    tiny OpenAI-compatible model server for tests and demos.
    """
    tokenizer = getattr(policy, "tokenizer", None)

    async def respond(body: dict[str, Any]) -> ScriptedReply:
        _, raw, log_probs, _ = await policy.get_action(body["messages"], body.get("tools"))
        logprobs = tokens = None
        if log_probs and log_probs.get("token_logprobs"):
            logprobs = [float(x) for x in log_probs["token_logprobs"]]
            ids = log_probs.get("tokens") or []
            if tokenizer is not None and ids and isinstance(ids[0], int):
                tokens = [tokenizer.decode([i]) for i in ids]
            elif ids:
                tokens = [str(t) for t in ids]
        finish = None
        if log_probs and log_probs.get("finish_reason") == "length":
            finish = "length"
        return ScriptedReply(
            content=raw or "", logprobs=logprobs, logprob_tokens=tokens, finish_reason=finish
        )

    return respond


def _error(message: str, status: int) -> JSONResponse:
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


class ScriptedOpenAIServer:
    """Serves `script` replies in order (then repeats the last one), or asks `responder`
    (sync or async, given the request body) for each reply."""

    def __init__(
        self,
        script: Sequence[ScriptedReply] | None = None,
        *,
        responder: Responder | None = None,
        model: str = "scripted",
        host: str = "127.0.0.1",
    ) -> None:
        if (script is None) == (responder is None):
            raise ValueError("give exactly one of `script` or `responder`")
        if script is not None and not script:
            raise ValueError("script must hold at least one reply")
        self.script = list(script or [])
        self.responder = responder
        self.model = model
        self.host = host
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # ---- the app -------------------------------------------------------------------------
    async def _next_reply(self, body: dict[str, Any]) -> ScriptedReply:
        with self._lock:
            index = len(self.requests)
            self.requests.append(body)
        if self.responder is not None:
            reply = self.responder(body)
            if inspect.isawaitable(reply):
                reply = await reply
            assert isinstance(reply, ScriptedReply)
            return reply
        return self.script[min(index, len(self.script) - 1)]

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        try:
            choices = guided_choices(body)
        except ValueError as exc:
            return _error(str(exc), 400)
        reply = await self._next_reply(body)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            return _error(reply.content or f"scripted status {reply.status}", reply.status)
        content = reply.content
        if choices is not None and content not in choices:
            return _error(f"the reply {content!r} is not one of guided_choice {choices}", 400)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        tokens = reply.logprob_tokens or (_tokens(content) if content else [])
        logprobs_block = None
        if body.get("logprobs") and tokens:
            values = reply.logprobs or [-0.05 * (1 + i % 7) for i in range(len(tokens))]
            if len(values) != len(tokens):
                raise ValueError(f"{len(values)} scripted logprobs for {len(tokens)} tokens")
            n_top = int(body.get("top_logprobs") or 0)
            tops = reply.top_logprobs or [{} for _ in tokens]
            if len(tops) != len(tokens):
                raise ValueError(f"{len(tops)} scripted top_logprobs for {len(tokens)} tokens")
            logprobs_block = {
                "content": [
                    {
                        "token": t,
                        "logprob": lp,
                        "bytes": list(t.encode()),
                        "top_logprobs": [
                            {"token": a, "logprob": alp, "bytes": list(a.encode())}
                            for a, alp in sorted(top.items(), key=lambda kv: -kv[1])[:n_top]
                        ],
                    }
                    for t, lp, top in zip(tokens, values, tops, strict=True)
                ],
                "refusal": None,
            }
        prompt_tokens = sum(
            len(_tokens(str(m.get("content") or ""))) for m in body.get("messages", [])
        )
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", self.model),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": logprobs_block,
                        "finish_reason": finish,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": len(tokens),
                    "total_tokens": prompt_tokens + len(tokens),
                },
            }
        )

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "created": 0, "owned_by": "agentrl"}
                ],
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    # ---- lifecycle -----------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 10.0) -> ScriptedOpenAIServer:
        config = uvicorn.Config(
            self.app(), host=self.host, port=0, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, name="scripted-openai", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("scripted OpenAI server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None
        self._thread = None

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
