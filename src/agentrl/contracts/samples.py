"""Synthetic trajectories for the reward benchmark, the tests and `agentrl rewards score --demo`.

They follow the seed's payload (Agent Zero style: a user message, tool calls, a response) and
vary what the reward components look at: domain, turn count, outcome, feedback, code (with a
pytest summary and, sometimes, a shell-injection bug), and PII in the text.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

DOMAINS = ("coding", "research", "data_analysis", "general")

_CODE = '''import subprocess


def total_{i}(values):
    """Sum of the values times {i}."""
    result = 0
    for v in values:
        result += v * {i}
    return result


def run_{i}(cmd):
    return subprocess.run(cmd, shell={shell}, check=False)


def test_total_{i}():
    assert total_{i}([1, 2]) == {three}
'''


def sample_trajectory(
    i: int,
    *,
    rng: random.Random | None = None,
    domain: str | None = None,
    turns: int | None = None,
    code: bool = False,
    pii: bool = False,
    status: str | None = None,
    feedback: str | None = None,
    trajectory_id: str | None = None,
    session_id: str | None = None,
    user_id: str | None = None,
    opt_out: bool = False,
) -> dict[str, Any]:
    """One trajectory payload (a dict for `agent.rl.trajectory.v1`)."""
    rng = rng or random.Random(i)
    domain = domain or ("coding" if code else rng.choice(DOMAINS))
    n_turns = turns or rng.randint(2, 9)
    start = datetime(2025, 12, 8, 12, 0, tzinfo=UTC) + timedelta(seconds=i)
    instructions = f"Task {i}: summarise the quarterly numbers for team {i % 17}"
    contact = f" Reach me at jane.doe{i}@example.com or +1 415-555-{i % 10000:04d}." if pii else ""
    out_turns: list[dict[str, Any]] = []
    for t in range(n_turns):
        ts = (start + timedelta(seconds=5 * t)).isoformat()
        last = t == n_turns - 1
        if t == 0:
            obs = {"type": "user_message", "content": instructions + contact}
        else:
            obs = {"type": "tool_result", "content": f"step {t} output for task {i}"}
        if code and t == 1:
            snippet = _CODE.format(i=i, shell="True" if i % 5 == 0 else "False", three=3 * i)
            action = {
                "type": "tool_call",
                "tool_name": "code_execution_tool",
                "tool_args": {"runtime": "python", "code": snippet},
                "raw_response": "Running the code and its test.",
            }
            result = {
                "success": True,
                "output": f"collected 1 item\n.\n============ 1 passed in 0.0{i % 10}s ============\n",
                "execution_time_ms": 120 + (i % 50),
            }
        elif last:
            secret = " My key is sk-proj-" + uuid.UUID(int=i).hex + "ABCDEFGH." if pii else ""
            action = {
                "type": "response",
                "raw_response": f"Done: the total for task {i} is {i * 3}.{secret}",
            }
            result = {"success": True, "output": None}
        else:
            tool = rng.choice(("knowledge_tool", "memory_load", "search_engine"))
            action = {
                "type": "tool_call",
                "tool_name": tool,
                "tool_args": {"query": f"numbers team {i % 17} part {t % 3}"},
                "raw_response": f"I will look up part {t % 3}.",
            }
            result = {"success": True, "output": f"found {t} rows", "execution_time_ms": 40 + t}
        out_turns.append(
            {
                "turn_id": t + 1,
                "timestamp": ts,
                "observation": obs,
                "thought_process": [f"thinking about step {t}"],
                "action": action,
                "result": result,
            }
        )
    status = status or rng.choice(
        ("completed_successfully", "completed_successfully", "partial_completion", "failed")
    )
    outcome: dict[str, Any] = {
        "task_status": status,
        "completion_percentage": round(rng.random(), 2)
        if status == "partial_completion"
        else (1.0 if status == "completed_successfully" else 0.0),
    }
    feedback = (
        feedback
        if feedback is not None
        else rng.choice(("none", "none", "thumbs_up", "thumbs_down", "rating"))
    )
    if feedback in ("thumbs_up", "thumbs_down"):
        outcome["user_feedback"] = {"type": feedback}
    elif feedback == "rating":
        outcome["user_feedback"] = {"type": "rating", "rating": rng.randint(1, 5)}
    metadata: dict[str, Any] = {
        "model": "qwen2.5-32b-instruct",
        "temperature": 0.7,
        "total_tokens": 500 * n_turns,
        "total_cost_usd": 0.0025 * n_turns,
    }
    if opt_out:
        metadata["rl_opt_out"] = True
    if user_id:
        metadata["user_id"] = user_id
    return {
        "trajectory_id": trajectory_id or str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "session_id": session_id or f"session-{i % 101}",
        "agent_id": "agent-zero-main",
        "subordinate_profile": "developer" if code else None,
        "start_timestamp": start.isoformat(),
        "end_timestamp": (start + timedelta(seconds=5 * n_turns)).isoformat(),
        "turns": out_turns,
        "task_context": {
            "task_id": f"task-{i}",
            "instructions": instructions + contact,
            "complexity_score": round(rng.random(), 2),
            "domain": domain,
        },
        "metadata": {**metadata, "outcome": outcome},  # the wire placement (contracts)
    }
