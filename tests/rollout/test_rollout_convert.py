"""Episode <-> agent.rl.trajectory.v1 payload, through JSON bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.advantages import system_apply_gigpo_to_batch_steps
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.envs import make_env, task_for
from agentrl.rollout import Episode, RLRolloutWorker, run_group
from agentrl.rollout.convert import episode_to_trajectory, trajectory_to_episode
from agentrl.rollout.policies import ScriptedPolicy


def through_the_wire(episode: Episode, **kw: Any) -> tuple[TrajectoryEvent, Episode]:
    event = episode_to_trajectory(episode, **kw)
    again = TrajectoryEvent.from_json(event.to_json())
    return again, trajectory_to_episode(again)


def assert_same_steps(a: Episode, b: Episode, *, messages_equal: bool = True) -> None:
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps, strict=True):
        assert y.system_step_index == x.system_step_index
        assert y.action_taken == x.action_taken
        assert y.raw_policy_output == x.raw_policy_output
        assert y.base_reward == x.base_reward
        assert y.is_done == x.is_done
        assert y.policy_logprobs == x.policy_logprobs
        assert y.step_info == json.loads(json.dumps(x.step_info))  # JSON: tuples -> lists
        assert y.observation_data["anchor"] == x.observation_data["anchor"]
        assert y.observation_data["env_observation"] == x.observation_data["env_observation"]
        assert y.resulting_messages_history == x.resulting_messages_history
        if messages_equal:
            assert y.observation_data["messages"] == x.observation_data["messages"]
    assert b.messages == a.messages


async def test_sokoban_group_round_trip() -> None:
    task = task_for("sokoban", seed=8)
    env = make_env("sokoban")
    env.reset(task.seed)
    plan = env.optimal_plan()  # type: ignore[attr-defined]
    policy = ScriptedPolicy(per_episode=[plan, ["up", "jump!", "left"]], action_format="text")
    episodes = await run_group(task, 2, policy, env_factory=make_env, max_episode_steps=len(plan))
    system_apply_gigpo_to_batch_steps(
        [e.steps for e in episodes], [float(e.success) for e in episodes], 0.5, 0.95
    )
    for episode in episodes:
        event, back = through_the_wire(episode, model="tiny", temperature=1.0)
        assert event.trajectory_id == episode.episode_id
        assert event.session_id == episode.group_id  # the group is the session
        assert [t.turn_id for t in event.turns] == list(range(1, len(episode.steps) + 1))
        assert event.turns[0].observation.type == "user_message"
        assert {t.observation.type for t in event.turns[1:]} <= {"tool_result"}
        assert event.task_context.task_id == task.name
        assert "You are playing Sokoban" in event.task_context.instructions
        # a null extra is omitted on the wire (the published schemas accept no null)
        assert (event.task_context.model_extra or {}).get("ground_truth") == episode.ground_truth
        assert [a.action.type for a in event.turns] == ["response"] * len(event.turns)
        assert event.outcome is not None
        assert event.outcome.task_status == (
            "completed_successfully" if episode.success else "failed"
        )
        assert_same_steps(episode, back)
        assert [s.advantage for s in back.steps] == [s.advantage for s in episode.steps]
        assert back.task == episode.task and back.ground_truth == episode.ground_truth
        assert back.group_id == episode.group_id and back.episode_index == episode.episode_index
    lost = episode_to_trajectory(episodes[1])
    assert lost.turns[1].result is not None and lost.turns[1].result.success is False
    assert lost.turns[1].result.error == "invalid action"


async def test_tool_calls_native_and_agent_zero_round_trip() -> None:
    task = task_for("tooluse-arithmetic", seed=1)
    native = {
        "type": "tool_call",
        "name": "calculator",
        "arguments": {"expression": "1+1"},
        "id": "call_9",
        "final": False,
    }
    answer = json.dumps(
        {"thoughts": ["so"], "tool_name": "response", "tool_args": {"text": str(task.ground_truth)}}
    )
    episode = await RLRolloutWorker(task, ScriptedPolicy([native, answer]), make_env).run()
    assert episode.success
    event, back = through_the_wire(episode)
    assert [t.action.type for t in event.turns] == ["tool_call", "response"]
    assert event.turns[0].action.tool_name == "calculator"
    assert event.turns[0].action.tool_args == {"expression": "1+1"}
    assert event.turns[1].thought_process == ["so"]
    assert event.turns[0].result is not None and "1+1 = 2" in event.turns[0].result.output
    assert event.turns[0].observation.context is not None
    assert event.turns[0].observation.context.available_tools == [
        "calculator",
        "code_exe",
        "response",
    ]
    assert_same_steps(episode, back)
    assert back.messages[3].role == "tool" and back.messages[3].tool_call_id == "call_9"


async def test_critical_error_and_windowed_history() -> None:
    def boom(observation: Any) -> str:
        raise TimeoutError("no answer")

    task = task_for("frozenlake-4x4", seed=0)
    worker = RLRolloutWorker(task, ScriptedPolicy(["left", "up", boom]), make_env, history_window=1)
    episode = await worker.run()
    assert episode.termination_reason == "critical_error"
    event, back = through_the_wire(episode)
    assert event.outcome is not None and event.outcome.task_abandoned is True
    last = event.turns[-1].result
    assert last is not None and last.success is False and "no answer" in str(last.error)
    # The window is not carried: each step comes back with the full history before it.
    assert_same_steps(episode, back, messages_equal=False)
    assert len(back.steps[2].observation_data["messages"]) > len(
        episode.steps[2].observation_data["messages"]
    )


def test_agent_zero_trajectory_becomes_trainable_steps() -> None:
    """A trajectory as Agent Zero publishes it (seed 000's example shape, no agentrl extras)."""
    payload = {
        "trajectory_id": "traj-1",
        "session_id": "sess-1",
        "agent_id": "agent-zero-main",
        "subordinate_profile": "developer",
        "start_timestamp": "2025-12-08T12:00:00Z",
        "end_timestamp": "2025-12-08T12:05:30Z",
        "turns": [
            {
                "turn_id": 1,
                "timestamp": "2025-12-08T12:00:00Z",
                "observation": {"type": "user_message", "content": "Sum 1..10 in Python"},
                "thought_process": ["write code"],
                "action": {
                    "type": "tool_call",
                    "tool_name": "code_exe",
                    "tool_args": {"code": "print(sum(range(11)))"},
                    "raw_response": '{"tool_name": "code_exe", "tool_args": {"code": "print(sum(range(11)))"}}',
                },
                "result": {
                    "success": True,
                    "output": "55",
                    "error": None,
                    "execution_time_ms": 120,
                },
            },
            {
                "turn_id": 2,
                "timestamp": "2025-12-08T12:00:05Z",
                "observation": {"type": "tool_result", "content": {"stdout": "55"}},
                "action": {
                    "type": "response",
                    "tool_name": "response",
                    "tool_args": {"text": "55"},
                },
                "result": {"success": True, "output": None},
            },
        ],
        "task_context": {
            "task_id": "t-1",
            "instructions": "Sum 1..10 in Python",
            "domain": "coding",
        },
        "metadata": {"model": "qwen2.5-32b-instruct", "temperature": 0.7},
        "outcome": {"task_status": "completed_successfully", "completion_percentage": 1.0},
    }
    event = TrajectoryEvent.from_json(json.dumps(payload))
    episode = trajectory_to_episode(event)
    first, second = episode.steps
    assert first.action_taken == {
        "type": "tool_call",
        "name": "code_exe",
        "arguments": {"code": "print(sum(range(11)))"},
        "final": False,
    }
    assert second.action_taken["final"] is True and second.action_taken["arguments"] == {
        "text": "55"
    }
    assert first.observation_data["anchor"] == "Sum 1..10 in Python"
    assert second.observation_data["anchor"] == '{"stdout": "55"}'
    assert first.base_reward is None and second.is_done and not first.is_done
    assert second.step_info["success"] is True and first.step_info["execution_time_ms"] == 120
    assert [m.role for m in episode.messages] == ["user", "assistant", "user", "assistant"]
    assert episode.messages[2].content == "55"
    system_apply_gigpo_to_batch_steps([episode.steps], [1.0], omega=0.5, gamma=0.9)
    assert all(s.advantage is not None for s in episode.steps)


def test_empty_episode_cannot_be_a_trajectory() -> None:
    from agentrl.rollout.models import TaskDefinition

    empty = Episode(
        steps=[],
        messages=[],
        ground_truth=None,
        task=TaskDefinition(name="t", env_id="x"),
        episode_id="e",
        group_id="g",
        reset_error="environment reset failed: boom",
    )
    with pytest.raises(ValueError, match="no steps"):
        episode_to_trajectory(empty)
