"""The slice of OpenAI's chat-completions wire format the gateway speaks, as pydantic models
(vLLM's `entrypoints/openai/protocol.py` is the model: requests mirror OpenAI's, unknown
fields are kept so vLLM/TensorZero extras pass through), and the result a backend returns.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0)  # <= 2 unless guided_choice (below)
    top_p: float | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None  # "none" | "auto" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool | None = None  # True: a list of calls may answer
    # Structured outputs (agentrl.serving.structured enforces them token by token):
    # OpenAI's {"type": "json_object"} / {"type": "json_schema", "json_schema": {...}} ...
    response_format: dict[str, Any] | None = None
    # ... and vLLM's extensions, the older guided_* fields and the newer object
    # (keys json, regex, choice, grammar, json_object).
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None
    user: str | None = None
    seed: int | None = None
    guided_choice: list[str] | None = None  # vLLM's extension: answer with one of these
    episode_id: str | None = None  # TensorZero's sticky key, accepted as a body field too
    stream_options: dict[str, Any] | None = None
    # (constraint,) once `agentrl.serving.structured.constraint_for` has built it for this
    # request (the gateway does, off the event loop; the engine then reads it back)
    _constraint: tuple[Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _temperature_range(self) -> ChatRequest:
        """OpenAI's range is 0-2. A guided_choice request (vLLM's extension) samples among a
        few choices, and an agent exploring them may ask for more, as vLLM allows."""
        if self.temperature is not None and self.temperature > 2.0 and not self.choices():
            raise ValueError("temperature must be <= 2 (above 2 only with guided_choice)")
        return self

    def choices(self) -> list[str] | None:
        """The answers a choice request allows: `guided_choice` or vLLM's newer
        `structured_outputs.choice` (both answered by scoring the choices)."""
        if self.guided_choice:
            return self.guided_choice
        so = self.structured_outputs
        choice = so.get("choice") if isinstance(so, dict) else None
        if isinstance(choice, list) and choice and all(isinstance(c, str) for c in choice):
            return list(choice)
        return None

    def token_limit(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


@dataclass
class Generation:
    """What a backend produced for one request (the gateway shapes the response from it)."""

    content: str | None
    finish_reason: str = "stop"
    tool_calls: list[dict[str, Any]] | None = None
    prompt_token_ids: list[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)  # each completion token as text
    top_logprobs: list[list[tuple[str, float]]] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    raw: dict[str, Any] | None = None  # an upstream answer, passed on as it came
    # Sampled under a grammar mask (structured outputs): the log-probs are those of the
    # masked distribution, and schema_hash names the constraint.
    constrained: bool = False
    schema_hash: str | None = None


def new_completion_id() -> str:
    # 128 random bits as 32 hex digits, as uuid4().hex gave, at a fifth of its cost (per request)
    return "chatcmpl-" + os.urandom(16).hex()


def logprobs_block(gen: Generation, top: int | None) -> dict[str, Any]:
    content = []
    for i, (tok, lp) in enumerate(zip(gen.tokens, gen.token_logprobs, strict=False)):
        alts = []
        if top and gen.top_logprobs is not None and i < len(gen.top_logprobs):
            alts = [
                {"token": t, "logprob": v, "bytes": list(t.encode())}
                for t, v in gen.top_logprobs[i][:top]
            ]
        content.append(
            {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": alts}
        )
    return {"content": content}


def completion_body(
    gen: Generation, completion_id: str, model: str, req: ChatRequest
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": gen.content}
    if gen.tool_calls:
        message["tool_calls"] = gen.tool_calls
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": gen.finish_reason,
        "logprobs": logprobs_block(gen, req.top_logprobs) if req.logprobs else None,
    }
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        },
    }


def chunk(
    completion_id: str,
    model: str,
    delta: dict[str, Any],
    finish: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
    }


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def tool_call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }
