"""Hand-made tool-use trajectories, shaped as rollout.convert writes the tool-use
environment's episodes (the env's info in each turn's `step_info`, the answer in
`task_context.ground_truth`)."""

from __future__ import annotations

from typing import Any

from agentrl.contracts.trajectory import TrajectoryEvent

CALC_SPEC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def call(tool: str, args: dict[str, Any], output: Any, **info: Any) -> dict[str, Any]:
    """A tool-call turn as rollout.convert writes it (the env's info in `step_info`)."""
    ok = not info.get("invalid_action")
    return {
        "action": {"type": "tool_call", "tool_name": tool, "tool_args": args},
        "result": {"success": ok, "output": output, "error": None if ok else "invalid action"},
        "step_info": {"invalid_action": False, **info},
    }


def answer(text: str, verdict: str = "correct") -> dict[str, Any]:
    return {
        "action": {"type": "response", "tool_name": "response", "tool_args": {"text": text}},
        "result": {"success": True, "output": f"Final answer received: {text}. {verdict}"},
        "step_info": {"invalid_action": False, "tool_name": "response"},
    }


def garbled() -> dict[str, Any]:
    """A reply the environment could not read (convert: a `response` marked invalid)."""
    return {
        "action": {"type": "response", "tool_args": {"text": "hmm"}},
        "result": {"success": False, "output": "Invalid action", "error": "invalid action"},
        "step_info": {"invalid_action": True},
    }


def trajectory(
    steps: list[dict[str, Any]],
    *,
    status: str | None,
    truth: Any = 10811,
    tool_specs: list[Any] | None = None,
    needed: list[Any] | None = None,
    task_id: str = "tooluse-arithmetic-7",
    tid: str = "t-1",
) -> TrajectoryEvent:
    turns = []
    for k, s in enumerate(steps):
        turns.append(
            {
                "turn_id": k + 1,
                "timestamp": f"2026-01-01T00:00:{k:02d}Z",
                "observation": {
                    "type": "user_message" if k == 0 else "tool_result",
                    "content": "What is (418 - 37) * 26 + 905?" if k == 0 else "result",
                },
                "action": s["action"],
                "result": s["result"],
                "step_info": s["step_info"],
            }
        )
    task: dict[str, Any] = {
        "task_id": task_id,
        "instructions": "What is (418 - 37) * 26 + 905?",
        "env_id": "tooluse-arithmetic",
    }
    if truth is not None:
        task["ground_truth"] = truth
    if tool_specs is not None:
        task["tool_specs"] = tool_specs
    if needed is not None:
        task["needed_values"] = needed
    meta: dict[str, Any] = {"model": "m"}
    if status is not None:
        meta["outcome"] = {
            "task_status": status,
            "completion_percentage": 1.0 if status == "completed_successfully" else 0.0,
        }
    return TrajectoryEvent.model_validate(
        {
            "trajectory_id": tid,
            "session_id": "s",
            "agent_id": "a",
            "start_timestamp": "2026-01-01T00:00:00Z",
            "end_timestamp": "2026-01-01T00:01:00Z",
            "turns": turns,
            "task_context": task,
            "metadata": meta,
        }
    )
