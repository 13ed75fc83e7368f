"""`OpenAIAgentPolicy`: any OpenAI-compatible chat endpoint (OpenAI, vLLM, our gateway)
through the official `openai` SDK.

It asks for token log-probs (trainers need the sampling policy's log-probs), parses OpenAI
tool calls and Agent Zero's JSON format, and retries failed calls itself with exponential
backoff (the SDK's own retries are off so the schedule is ours and visible). When every
attempt has failed it raises `PolicyError`; the worker turns that into a critical-error end
of the episode.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion

from agentrl.rollout.parsing import ActionFormat, parse_policy_output
from agentrl.rollout.policy import PolicyError, PolicyOutput, as_chat_messages, openai_tools

log = logging.getLogger(__name__)

# 4xx answers that a retry can fix; any other 4xx is our request's fault and fails at once.
RETRYABLE_4XX = frozenset({408, 409, 429})


def is_retryable(exc: BaseException) -> bool:
    """Connection problems, timeouts, 5xx and 408/409/429 are worth retrying."""
    if isinstance(exc, openai.APIConnectionError | openai.APITimeoutError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in RETRYABLE_4XX
    return isinstance(exc, asyncio.TimeoutError | openai.APIResponseValidationError)


class OpenAIAgentPolicy:
    """An AgentPolicy backed by the SDK's `POST /chat/completions` (`_create`).

    `max_retries` extra attempts follow the first, the k-th after
    min(backoff_max, backoff_base * 2**k) seconds (+ up to 10% jitter). log_probs holds
    {"tokens", "token_logprobs", "sum"} when the server returned log-probs, plus "usage",
    "top_logprobs" (per token, when asked with `top_logprobs`), and always the response's
    "completion_id" (`response.id`) and "model" (the serving version's name): the gateway's
    contract, so the trajectory can carry `action.completion_id` and `metadata.model`.

    `guided_choice` (vLLM's convention, sent in the request body) restricts the answer to one
    of the given strings: the valid-action policy over HTTP; a callable gets the observation
    and returns the choices of this turn (e.g. the environment's valid moves).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = 0.7,
        max_tokens: int | None = 512,
        logprobs: bool = True,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        action_format: ActionFormat = "auto",
        extra_body: dict[str, Any] | None = None,
        client: AsyncOpenAI | None = None,
        guided_choice: Sequence[str] | Callable[[Any], Sequence[str] | None] | None = None,
        top_logprobs: int | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.action_format = action_format
        self.extra_body = extra_body
        self.guided_choice = guided_choice
        if top_logprobs is not None and not 0 <= top_logprobs <= 20:
            raise ValueError("top_logprobs must be within 0..20 (OpenAI's limit)")
        self.top_logprobs = top_logprobs
        self.client = client or AsyncOpenAI(
            base_url=base_url,
            # A local server needs no key, but the SDK insists on one being set.
            api_key=api_key or "not-needed",
            timeout=timeout,
            max_retries=0,
        )
        self.total_tokens = 0
        self.calls = 0
        self.failed_attempts = 0

    def backoff(self, attempt: int) -> float:
        delay = min(self.backoff_max, self.backoff_base * (2**attempt))
        return delay * (1.0 + 0.1 * random.random())

    def choices_for(self, observation: Any) -> list[str] | None:
        gc = self.guided_choice
        if gc is None:
            return None
        found = gc(observation) if callable(gc) else gc
        return [str(c) for c in found] if found else None

    async def _create(
        self, messages: list[dict[str, Any]], tools: Any, choices: list[str] | None = None
    ) -> ChatCompletion:
        """POST /chat/completions through the client's `post`: the same request as
        `chat.completions.create` (headers, auth, JSON body, errors, the parsed
        `ChatCompletion`) without its walk of every parameter against the SDK's typed
        dicts, which changes nothing in plain JSON messages and cost 2.2 of its 4.0 CPU-ms
        a call with three messages (more as a chat grows; the loop's agents make
        thousands)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.logprobs:
            body["logprobs"] = True
            if self.top_logprobs is not None:
                body["top_logprobs"] = self.top_logprobs
        if tools and not choices:
            body["tools"] = tools
        body.update(self.extra_body or {})  # as the SDK merges `extra_body`: last
        if choices:
            body["guided_choice"] = choices
        return await self.client.post("/chat/completions", body=body, cast_to=ChatCompletion)

    async def get_action(
        self, observation: Any, available_tools_specs: list[dict[str, Any]] | None = None
    ) -> PolicyOutput:
        messages = as_chat_messages(observation)
        tools = openai_tools(available_tools_specs)
        choices = self.choices_for(observation)
        last: BaseException | None = None
        for attempt in range(self.max_retries + 1):
            try:
                response = await self._create(messages, tools, choices)
            except Exception as exc:
                self.failed_attempts += 1
                if not is_retryable(exc):
                    raise PolicyError(
                        f"OpenAI endpoint refused the request ({type(exc).__name__}: {exc}); "
                        "check model name, messages and tool specs"
                    ) from exc
                last = exc
                if attempt < self.max_retries:
                    delay = self.backoff(attempt)
                    log.warning(
                        "policy call failed (%s), retry %d/%d in %.2fs",
                        type(exc).__name__,
                        attempt + 1,
                        self.max_retries,
                        delay,
                    )
                    await asyncio.sleep(delay)
                continue
            self.calls += 1
            return self._parse(response)
        raise PolicyError(
            f"OpenAI endpoint failed {self.max_retries + 1} times "
            f"(last: {type(last).__name__}: {last}); is the server up at {self.client.base_url}?"
        ) from last

    def _parse(self, response: Any) -> PolicyOutput:
        if not response.choices:
            return {"type": "invalid", "error": "response has no choices"}, None, None, None
        choice = response.choices[0]
        message = choice.message
        raw = message.content
        action = parse_policy_output(
            raw, tool_calls=list(message.tool_calls or []), action_format=self.action_format
        )
        log_probs: dict[str, Any] = {}
        content_lp = getattr(choice.logprobs, "content", None) if choice.logprobs else None
        if content_lp:
            token_logprobs = [float(t.logprob) for t in content_lp]
            log_probs = {
                "tokens": [t.token for t in content_lp],
                "token_logprobs": token_logprobs,
                "sum": float(sum(token_logprobs)),
            }
            tops = [list(getattr(t, "top_logprobs", None) or []) for t in content_lp]
            if any(tops):
                log_probs["top_logprobs"] = [
                    {str(a.token): float(a.logprob) for a in row} for row in tops
                ]
        # The serving version and the completion id: kept whatever else came back.
        if getattr(response, "id", None):
            log_probs["completion_id"] = str(response.id)
        if getattr(response, "model", None):
            log_probs["model"] = str(response.model)
        if getattr(choice, "finish_reason", None):  # "length": cut by max_tokens
            log_probs["finish_reason"] = str(choice.finish_reason)
        usage = getattr(response, "usage", None)
        if usage is not None:
            self.total_tokens += int(usage.total_tokens or 0)
            if "token_logprobs" in log_probs:
                log_probs["usage"] = {
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "total_tokens": usage.total_tokens,
                }
        return action, raw, log_probs or None, None
