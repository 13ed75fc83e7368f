"""Hand-built events for the warehouse's tests and benchmark: every field that the queries
and export filters look at is a parameter, so expected answers can be computed by hand."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from agentrl.contracts.feedback import FeedbackEvent
from agentrl.contracts.reward import RewardEvent
from agentrl.contracts.trajectory import TrajectoryEvent

BASE = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def tid(i: int) -> str:
    """Deterministic canonical UUID of trajectory `i`."""
    return str(uuid.UUID(int=i + 1, version=4))


def trajectory(
    i: int,
    *,
    model: str = "m-1",
    domain: str = "coding",
    profile: str | None = None,
    start: datetime | None = None,
    tools: Sequence[tuple[str, bool, float]] = (("search", True, 10.0), ("code_exe", True, 20.0)),
    status: str = "completed_successfully",
    tokens: int = 100,
) -> TrajectoryEvent:
    """Trajectory `i`: one turn per (tool, success, ms) in `tools`, then a final response."""
    start = start or BASE + timedelta(seconds=i)
    turns: list[dict[str, Any]] = []
    for t, (tool, ok, dur) in enumerate(tools):
        turns.append(
            {
                "turn_id": t + 1,
                "timestamp": (start + timedelta(milliseconds=t)).isoformat(),
                "observation": {"type": "tool_result" if t else "user_message", "content": "x"},
                "action": {"type": "tool_call", "tool_name": tool, "tool_args": {"q": "abc"}},
                "result": {
                    "success": ok,
                    "output": "y",
                    "execution_time_ms": dur,
                    **({} if ok else {"error": "boom"}),
                },
            }
        )
    n = len(turns)
    turns.append(
        {
            "turn_id": n + 1,
            "timestamp": (start + timedelta(milliseconds=n)).isoformat(),
            "observation": {"type": "tool_result", "content": "z"},
            "action": {"type": "response", "raw_response": "done"},
            "result": {"success": status == "completed_successfully", "execution_time_ms": 1.0},
        }
    )
    payload: dict[str, Any] = {
        "trajectory_id": tid(i),
        "session_id": f"s-{i}",
        "agent_id": "agent-zero-main",
        "start_timestamp": start.isoformat(),
        "end_timestamp": (start + timedelta(milliseconds=n + 1)).isoformat(),
        "turns": turns,
        "task_context": {"task_id": f"task-{i % 7}", "instructions": "do it", "domain": domain},
        "metadata": {
            "model": model,
            "temperature": 0.7,
            "total_tokens": tokens,
            "total_cost_usd": 0.001,
            "outcome": {"task_status": status, "completion_percentage": 1.0},
        },
    }
    if profile is not None:
        payload["subordinate_profile"] = profile
    return TrajectoryEvent.model_validate(payload)


def reward(
    i: int,
    total: float,
    *,
    version: int = 1,
    model: str = "m-1",
    at: datetime | None = None,
) -> RewardEvent:
    at = at or BASE + timedelta(seconds=i, milliseconds=500)
    return RewardEvent.model_validate(
        {
            "reward_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{i}/{version}")),
            "trajectory_id": tid(i),
            "session_id": f"s-{i}",
            "timestamp": at.isoformat(),
            "reward_components": {
                "task_completion": {"score": total, "weight": 0.6, "source": "automated"},
                "efficiency": {"score": 0.5, "weight": 0.4, "source": "automated"},
            },
            "total_reward": total,
            "normalization": {
                "method": "none",
                "raw_total_reward": total,
                "normalized_total_reward": 0.0,
                "total_reward_kind": "raw",
            },
            "metadata": {"version": version, "calculator_version": "test-1", "model": model},
        }
    )


def feedback(i: int, kind: str = "thumbs_up", rating: int | None = None) -> FeedbackEvent:
    payload: dict[str, Any] = {
        "trajectory_id": tid(i),
        "timestamp": (BASE + timedelta(seconds=i, milliseconds=700)).isoformat(),
        "type": kind,
        "feedback_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"fb/{i}/{kind}")),
    }
    if rating is not None:
        payload["rating"] = rating
    return FeedbackEvent.model_validate(payload)
