"""What the framework tests share: one small tool, and the answers the tiny random model is
steered to give (vLLM's `guided_choice`, which the gateway serves: the choice's tokens are
scored by the model, so the completion log still holds exact token ids and log-probs)."""

from __future__ import annotations

import json
from typing import Any

TASK = "What is 2 + 3? Use the add tool."
SYSTEM = "You are a careful calculator."
CALL = json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}})
FINAL = "The sum is 5."
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


def add(a: float, b: float) -> str:
    """Add two numbers."""
    return str(int(a + b) if float(a + b).is_integer() else a + b)


def steer(choice: str) -> dict[str, Any]:
    """The request body extra that makes the tiny model answer `choice`."""
    return {"guided_choice": [choice]}


def assert_tool_episode(
    traj: dict[str, Any], version: str, tool_turns: int = 1, exact: bool = True
) -> None:
    """`tool_turns` add calls with their results, then the final text answer."""
    turns = traj["turns"]
    assert len(turns) == tool_turns + 1, [t["action"] for t in turns]
    assert TASK in traj["task_context"]["instructions"]
    assert turns[0]["observation"]["type"] == "user_message"
    for t in turns[:tool_turns]:
        assert t["action"]["type"] == "tool_call"
        assert t["action"]["tool_name"] == "add"
        assert t["action"]["tool_args"] == {"a": 2, "b": 3}
        assert t["result"]["success"] is True and "5" in str(t["result"]["output"])
    for t in turns[1:]:
        assert t["observation"]["type"] == "tool_result" and "5" in str(t["observation"]["content"])
    last = turns[-1]["action"]
    assert last["type"] == "response" and last["raw_response"] == FINAL
    if exact:  # every action names its completion (the key of the exact tokens)
        assert all(t["action"]["completion_id"].startswith("chatcmpl-") for t in turns)
    assert traj["metadata"]["model"] == version
    assert traj["metadata"]["serving_versions"] == [version]
