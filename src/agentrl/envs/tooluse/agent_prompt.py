"""What a tool-use agent sees and may say, as Agent Zero shows it: a system prompt that lists
the tools and the JSON reply format, the user's task as the first user message, each tool's
result as a user message `{"tool_name": ..., "tool_result": ...}`, and a JSON Schema for one
reply that structured outputs enforce token by token.

Why no example arguments: with `(3 + 4) * 2` or `print(1 + 1)` in the prompt SmolLM2-135M
copied them in 712 of 717 turns (issue 30), so the prompt says what each argument IS and
leaves the model nothing to copy but the task. Why short `thoughts` (one item, a short
string): every generated token costs a decode step on a CPU, and Agent Zero's format needs
one thought, not an essay.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TOOLS = ("calculator", "code_exe", "response")
THOUGHT_CHARS = 40  # one short thought: a 100-character cap was run to the end (issue 30)
HEADLINE_CHARS = 40
RESULT_CHARS = 600  # a longer tool output (a traceback, a flood of prints) keeps head and tail

SYSTEM_PROMPT = """You are Agent Zero, an autonomous agent. Solve the user's task with tools.

## Communication
Reply with one valid JSON object with these fields:
thoughts: array with one short thought about the next step
headline: short headline of the step (optional)
tool_name: name of the tool to use
tool_args: object with the tool's arguments
No text outside the JSON.

## Tools available
### calculator
evaluates an arithmetic expression
tool_args: expression: the expression to evaluate
### code_exe
runs a Python 3 program and shows what it prints
tool_args: code: the whole program; it must print the result
### response
final answer to the user; ends the task
tool_args: text: the answer

## Method
Compute with calculator or code_exe first, then answer with response, giving the result the tool showed."""

_ARGS: dict[str, dict[str, Any]] = {
    "calculator": {"expression": {"type": "string", "minLength": 1, "maxLength": 200}},
    "code_exe": {"code": {"type": "string", "minLength": 1, "maxLength": 700}},
    "response": {"text": {"type": "string", "minLength": 1, "maxLength": 100}},
}


@dataclass(frozen=True)
class Turn:
    """One step of an episode: the agent's reply and what the environment answered (None
    for a reply that ended the episode)."""

    reply: str
    result: str | None = None
    tool_name: str | None = None


def tool_args_schema(tool: str) -> dict[str, Any]:
    """The arguments object of one tool: its one string argument, nothing else."""
    if tool not in _ARGS:
        raise ValueError(f"unknown tool {tool!r}: use one of {', '.join(TOOLS)}")
    props = _ARGS[tool]
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def response_schema(tools: Sequence[str] = TOOLS) -> dict[str, Any]:
    """JSON Schema of one reply in Agent Zero's format: one branch per tool (anyOf, keyed by
    the `tool_name` const), so the arguments always fit the tool that is named."""
    branches = []
    for tool in tools:
        branches.append(
            {
                "type": "object",
                "properties": {
                    "thoughts": {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1, "maxLength": THOUGHT_CHARS},
                        "minItems": 1,
                        "maxItems": 1,
                    },
                    "headline": {"type": "string", "maxLength": HEADLINE_CHARS},
                    "tool_name": {"const": tool},
                    "tool_args": tool_args_schema(tool),
                },
                "required": ["thoughts", "tool_name", "tool_args"],
                "additionalProperties": False,
            }
        )
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def user_message(question: str) -> dict[str, str]:
    """The task as the user types it to Agent Zero."""
    return {"role": "user", "content": question}


def tool_result_message(tool_name: str | None, result: str) -> dict[str, str]:
    """A tool's result as Agent Zero feeds it back: a user message holding a JSON object."""
    if len(result) > RESULT_CHARS:  # every later prompt carries it: keep it short
        half = RESULT_CHARS // 2
        result = (
            f"{result[:half]}\n[... {len(result) - 2 * half} characters cut ...]\n{result[-half:]}"
        )
    body = {"tool_name": tool_name or "unknown", "tool_result": result}
    return {"role": "user", "content": json.dumps(body, ensure_ascii=False)}


def messages_for(question: str, history: Sequence[Turn] = ()) -> list[dict[str, str]]:
    """The chat messages the agent sees before its next reply."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, user_message(question)]
    for turn in history:
        messages.append({"role": "assistant", "content": turn.reply})
        if turn.result is not None:
            messages.append(tool_result_message(turn.tool_name, turn.result))
    return messages


def reply(thought: str, tool: str, **args: str) -> str:
    """A reply as compact JSON (the separators the structured-outputs grammar enforces)."""
    return json.dumps(
        {"thoughts": [thought], "tool_name": tool, "tool_args": args}, ensure_ascii=False
    )
