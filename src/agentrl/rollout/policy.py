"""The `AgentPolicy` protocol (seed 002, Task 2.2): what the rollout worker asks a model.

`get_action(observation, available_tools_specs=None)` returns
  (action_structured, raw_policy_output, log_probs, value_estimate)
with action_structured one of
  {"type": "text", "content": ...}
  {"type": "tool_call", "name": ..., "arguments": {...}, ...}
  {"type": "terminate"}
  {"type": "invalid", "error": ...}        (output that could not be parsed)
A policy raises `PolicyError` only when it could not produce any output at all (an
endpoint down after every retry); the worker then ends the episode with a critical error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from agentrl.core.errors import AgentRLError
from agentrl.rollout.models import Message

PolicyOutput = tuple[dict[str, Any], str | None, dict[str, Any] | None, float | None]


class PolicyError(AgentRLError):
    """The policy could not produce an action (after its retries); ends the episode."""


@runtime_checkable
class AgentPolicy(Protocol):
    async def get_action(
        self,
        observation: Any,
        available_tools_specs: list[dict[str, Any]] | None = None,
    ) -> PolicyOutput: ...


def as_chat_messages(observation: Any) -> list[dict[str, Any]]:
    """An observation (Messages, OpenAI dicts, or a plain string) -> OpenAI message dicts."""
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, dict) and "messages" in observation:
        observation = observation["messages"]
    if not isinstance(observation, Sequence):
        raise ValueError(
            f"observation must be a list of messages or a string, got {type(observation).__name__}"
        )
    out: list[dict[str, Any]] = []
    for m in observation:
        if isinstance(m, Message):
            out.append(m.to_openai())
        elif isinstance(m, dict) and "role" in m:
            out.append({k: v for k, v in m.items() if v is not None})
        else:
            raise ValueError(f"observation item {m!r} is neither a Message nor a message dict")
    return out


def openai_tools(specs: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tool specs in OpenAI's `tools` shape; bare function schemas get wrapped."""
    if not specs:
        return None
    return [
        s if s.get("type") == "function" else {"type": "function", "function": s} for s in specs
    ]
