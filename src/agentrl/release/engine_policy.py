"""A rollout policy that decodes with the gateway's own local engine.

Validation plays benchmark episodes the way the agents are served: through `LocalEngine`
(batched decoding, adapters, and structured outputs — a `response_format` enforced token
by token). A tool-use version is judged on the JSON it can actually emit behind the
gateway, not on free text the gateway would never let through.
"""

from __future__ import annotations

from typing import Any

from agentrl.rollout.parsing import parse_policy_output
from agentrl.rollout.policy import PolicyOutput, as_chat_messages
from agentrl.serving.openai_types import ChatRequest


class EnginePolicy:
    """`get_action(messages)` -> one completion of `model_id` (an adapter, or None: the
    base) under `response_format`, greedy unless `temperature` says otherwise."""

    def __init__(
        self,
        engine: Any,
        model_id: str | None,
        *,
        response_format: dict[str, Any] | None = None,
        temperature: float = 0.0,
        max_tokens: int = 256,
    ) -> None:
        self.engine = engine
        self.model_id = model_id
        self.response_format = response_format
        self.temperature = temperature
        self.max_tokens = max_tokens

    async def get_action(
        self, observation: Any, available_tools_specs: list[dict[str, Any]] | None = None
    ) -> PolicyOutput:
        messages = [{**m, "content": m.get("content") or ""} for m in as_chat_messages(observation)]
        request = ChatRequest(
            model=self.model_id or "base",
            messages=messages,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            response_format=self.response_format,
        )
        gen = await self.engine.generate(self.model_id, request)
        raw = gen.content or ""
        action = parse_policy_output(raw, action_format="auto")
        log_probs = {
            "tokens": list(gen.completion_token_ids),
            "token_logprobs": list(gen.token_logprobs),
            "sum": float(sum(gen.token_logprobs)),
            "prompt_ids": list(gen.prompt_token_ids),
            "finish_reason": gen.finish_reason,
            "temperature": self.temperature,
            "constrained": bool(getattr(gen, "constrained", False)),
        }
        return action, raw, log_probs, None
