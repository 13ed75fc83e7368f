"""An episode as an `agent.rl.trajectory.v1` payload, and a trajectory as an episode.

Rollouts travel the same road as Agent Zero's real work (bus, warehouse, rewards), and Agent
Zero's trajectories can be trained on with the rollout machinery (GiGPO needs StepData).

Mapping (seed 000's fields; the RL-only data rides in extra fields the contract keeps):
  turn                <- one StepData; turn_id = system_step_index + 1 (the seed counts from 1)
  observation.type    "user_message" on the first turn, then "tool_result"
  observation.content the environment's text; extras `anchor`, `env_observation`
  thought_process     Agent Zero's "thoughts"
  action              tool_call -> "tool_call" (call_subordinate -> "subordinate_call");
                      the final `response` tool and plain text -> "response";
                      extra `structured` = action_structured, unchanged
  result              success = not invalid and no critical error; output = the next
                      observation; error; execution_time_ms
  turn extras         reward, done, logprobs, value, step_info
  task_context        task_id = task name; instructions = the task's opening messages and first
                      observation; extras env_id, seed, ground_truth, max_episode_steps, ...
  metadata.outcome    completed_successfully if the last step succeeded, else failed
Coming back, an Agent Zero trajectory without extras gets its anchors from the observation
content (the state the agent saw, without history) and base_reward None.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from agentrl.contracts.trajectory import (
    Action,
    ActionType,
    Observation,
    ObservationContext,
    Outcome,
    TaskContext,
    TrajectoryEvent,
    TrajectoryMetadata,
    Turn,
    TurnResult,
)
from agentrl.rollout.models import Message, StepData, TaskDefinition
from agentrl.rollout.parsing import FINAL_TOOL, agent_zero_json, openai_tool_calls
from agentrl.rollout.worker import CRITICAL_ERROR, TERMINATE_ACTION, Episode

SUBORDINATE_TOOL = "call_subordinate"  # Agent Zero's tool for delegating to a subordinate


def _jsonable(value: Any) -> Any:
    """A JSON-safe copy (environment info may hold numpy scalars and the like)."""
    return json.loads(json.dumps(value, default=str))


def _action_payload(action: dict[str, Any], raw: str | None) -> Action:
    kind = action.get("type")
    a_type: ActionType
    if kind == "tool_call":
        name = str(action.get("name"))
        if name == FINAL_TOOL:
            a_type = "response"
        elif name == SUBORDINATE_TOOL:
            a_type = "subordinate_call"
        else:
            a_type = "tool_call"
        args = dict(action.get("arguments") or {})
        return Action(
            type=a_type, tool_name=name, tool_args=args, raw_response=raw, structured=action
        )
    args = {"text": action["content"]} if kind == "text" else {}
    return Action(
        type="response", tool_name=None, tool_args=args, raw_response=raw, structured=action
    )


def _token_count(log_probs: dict[str, Any] | None) -> int:
    if not log_probs:
        return 0
    usage = log_probs.get("usage")
    if isinstance(usage, dict) and usage.get("total_tokens") is not None:
        return int(usage["total_tokens"])
    return len(log_probs.get("prompt_ids") or []) + len(log_probs.get("tokens") or [])


def _instructions(episode: Episode) -> str:
    """The task as the agent was given it: opening messages and first observation."""
    n = len(episode.task.initial_messages) + 1
    parts = [m.content for m in episode.messages[:n] if m.content]
    return "\n\n".join(parts) or episode.task.name


def episode_to_trajectory(
    episode: Episode,
    *,
    agent_id: str = "agentrl-rollout",
    model: str | None = None,
    temperature: float | None = None,
    domain: str = "general",
    subordinate_profile: str | None = None,
    redact: bool = True,
) -> TrajectoryEvent:
    """A finished episode as an `agent.rl.trajectory.v1` event (trajectory_id = episode_id,
    session_id = group_id, so a GiGPO group is one session). PII is redacted (the edge: what
    is published never carries it) unless `redact=False`."""
    steps = episode.steps
    if not steps:
        raise ValueError(
            f"episode {episode.episode_id} has no steps ({episode.critical_error}); a trajectory "
            "needs at least one turn"
        )
    task = episode.task
    turns = []
    total_tokens = 0
    for i, step in enumerate(steps):
        obs_data = step.observation_data if isinstance(step.observation_data, dict) else {}
        env_obs = obs_data.get("env_observation") or {}
        info = step.step_info
        next_text = (
            steps[i + 1].observation_data.get("env_observation", {}).get("text")
            if i + 1 < len(steps)
            else _last_answer(step)
        )
        error = info.get("critical_error") or info.get("parse_error")
        invalid = bool(info.get("invalid_action"))
        if error is None and invalid:
            error = "invalid action"
        timestamp = info.get("timestamp") or episode.start_time.isoformat()
        total_tokens += _token_count(step.policy_logprobs)
        turns.append(
            Turn(
                turn_id=step.system_step_index + 1,
                timestamp=datetime.fromisoformat(timestamp),
                observation=Observation(
                    type="user_message" if i == 0 else "tool_result",
                    content=env_obs.get("text", ""),
                    context=ObservationContext(
                        available_tools=[
                            (s.get("function") or s).get("name") for s in task.tool_specs
                        ],
                    ),
                    anchor=_jsonable(obs_data.get("anchor")),
                    env_observation=_jsonable(env_obs),
                ),
                thought_process=[str(t) for t in step.action_taken.get("thoughts", [])],
                action=_action_payload(_jsonable(step.action_taken), step.raw_policy_output),
                result=TurnResult(
                    success=not invalid and not info.get("critical_error"),
                    output=next_text,
                    error=error,
                    execution_time_ms=info.get("execution_time_ms"),
                ),
                reward=step.base_reward,
                done=step.is_done,
                logprobs=_jsonable(step.policy_logprobs),
                value=step.policy_value_estimate,
                step_info=_jsonable(info),
                advantage=step.advantage,
                return_to_go=step.return_to_go,
            )
        )
    success = episode.success
    reason = episode.termination_reason
    event = TrajectoryEvent(
        trajectory_id=episode.episode_id,
        session_id=episode.group_id,
        agent_id=agent_id,
        subordinate_profile=subordinate_profile,
        start_timestamp=episode.start_time,
        end_timestamp=max(episode.end_time, episode.start_time),
        turns=turns,
        task_context=TaskContext(
            task_id=task.name,
            instructions=_instructions(episode),
            domain=domain,  # type: ignore[arg-type]
            env_id=task.env_id,
            seed=task.seed,
            ground_truth=_jsonable(episode.ground_truth),
            max_episode_steps=task.max_episode_steps,
            termination_regex=task.termination_regex,
            env_kwargs=_jsonable(task.env_kwargs),
            tool_specs=_jsonable(task.tool_specs),
            initial_messages=[m.to_openai() for m in task.initial_messages],
        ),
        metadata=TrajectoryMetadata(
            model=model or "unknown",
            temperature=temperature,
            total_tokens=total_tokens or None,
            episode_index=episode.episode_index,
            termination_reason=reason,
            total_reward=episode.total_reward,
            outcome=Outcome(
                task_status="completed_successfully" if success else "failed",
                completion_percentage=1.0 if success else 0.0,
                task_abandoned=reason in (TERMINATE_ACTION, CRITICAL_ERROR),
            ),
        ),
    )
    if redact:  # scrubbed before it is published and stored (agentrl.rewards.redact)
        from agentrl.rewards.redact import redact_event

        event, _ = redact_event(event)
    return event


def _last_answer(step: StepData) -> str | None:
    """The environment's answer to the last action (the final message, if it is one)."""
    if step.step_info.get("error_source") == "policy":  # the policy said nothing: no answer
        return None
    history = step.resulting_messages_history
    if history and history[-1].role in ("user", "tool"):
        return history[-1].content
    return None


def _extra(model: Any, name: str, default: Any = None) -> Any:
    return (model.model_extra or {}).get(name, default)


def _derive_action(action: Action) -> dict[str, Any]:
    """action_structured for a turn that did not come from agentrl (no `structured` extra)."""
    if action.type == "response" and action.tool_name in (None, FINAL_TOOL):
        if action.tool_name == FINAL_TOOL:
            return {
                "type": "tool_call",
                "name": FINAL_TOOL,
                "arguments": dict(action.tool_args),
                "final": True,
            }
        text = action.tool_args.get("text", action.raw_response)
        if text is None:
            return {"type": "invalid", "error": "response without text"}
        return {"type": "text", "content": str(text)}
    return {
        "type": "tool_call",
        "name": action.tool_name or action.type,
        "arguments": dict(action.tool_args),
        "final": False,
    }


def _content_text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True)


def trajectory_to_episode(event: TrajectoryEvent) -> Episode:
    """An `agent.rl.trajectory.v1` event as an Episode (StepData + messages + ground truth).

    For our own rollouts this inverts `episode_to_trajectory`, except that each step's
    `observation_data["messages"]` is the full history before the step (the policy's
    window is not carried). For Agent Zero's trajectories: anchors are the observation
    contents, rewards None (GiGPO uses its default step reward), messages are rebuilt as
    instructions, then assistant raw response and observation per turn.
    """
    ctx = event.task_context
    initial = [Message.from_openai(m) for m in _extra(ctx, "initial_messages", [])]
    task = TaskDefinition(
        name=ctx.task_id,
        env_id=_extra(ctx, "env_id", "agent_zero"),
        seed=int(_extra(ctx, "seed", 0)),
        initial_messages=initial,
        tool_specs=list(_extra(ctx, "tool_specs", [])),
        ground_truth=_extra(ctx, "ground_truth"),
        max_episode_steps=int(_extra(ctx, "max_episode_steps", max(len(event.turns), 1))),
        termination_regex=_extra(ctx, "termination_regex"),
        env_kwargs=dict(_extra(ctx, "env_kwargs", {})),
    )
    history: list[Message] = list(initial)
    steps: list[StepData] = []
    for i, turn in enumerate(event.turns):
        obs = turn.observation
        text = _content_text(obs.content)
        if i == 0 and not initial and _extra(ctx, "env_id") is None and ctx.instructions != text:
            history.append(Message(role="user", content=ctx.instructions))
        previous = event.turns[i - 1].result if i else None
        previous_output = previous.output if previous is not None else None
        if i == 0 or previous_output is None:
            history.append(Message(role="user", content=text))
        anchor = _extra(obs, "anchor")
        env_obs = _extra(obs, "env_observation") or {"text": text, "anchor": anchor or text}
        if anchor is None:
            anchor = env_obs.get("anchor", text)
        structured = _extra(turn.action, "structured") or _derive_action(turn.action)
        observation_data = {
            "anchor": anchor,
            "env_observation": env_obs,
            "messages": [m.to_openai() for m in history],
        }
        info_extra = _extra(turn, "step_info") or {}
        if info_extra.get("error_source") != "policy":  # a failed policy call said nothing
            history.append(_assistant_message(structured, turn.action.raw_response))
        if turn.result is not None and turn.result.output is not None:
            history.append(_answer_message(structured, _content_text(turn.result.output)))
        info = _extra(turn, "step_info")
        if info is None:
            info = {"invalid_action": not turn.result.success if turn.result else False}
            if turn.result is not None and turn.result.error:
                info["error"] = turn.result.error
            if turn.result is not None and turn.result.execution_time_ms is not None:
                info["execution_time_ms"] = turn.result.execution_time_ms
        steps.append(
            StepData(
                system_step_index=turn.turn_id - 1,
                observation_data=observation_data,
                action_taken=structured,
                raw_policy_output=turn.action.raw_response,
                resulting_messages_history=list(history),
                policy_logprobs=_extra(turn, "logprobs"),
                policy_value_estimate=_extra(turn, "value"),
                is_done=bool(_extra(turn, "done", i == len(event.turns) - 1)),
                step_info=dict(info),
                base_reward=_extra(turn, "reward"),
                advantage=_extra(turn, "advantage"),
                return_to_go=_extra(turn, "return_to_go"),
            )
        )
    meta = event.metadata
    status = event.outcome.task_status if event.outcome else None
    derived = event.turns and _extra(event.turns[-1], "step_info") is None
    if derived and status is not None and "success" not in steps[-1].step_info:
        steps[-1].step_info["success"] = status == "completed_successfully"
    return Episode(
        steps=steps,
        messages=history,
        ground_truth=task.ground_truth,
        task=task,
        episode_id=event.trajectory_id,
        group_id=event.session_id,
        episode_index=int(_extra(meta, "episode_index", 0)),
        termination_reason=_extra(meta, "termination_reason"),
        start_time=event.start_timestamp.astimezone(UTC),
        end_time=event.end_timestamp.astimezone(UTC),
    )


def _assistant_message(action: dict[str, Any], raw: str | None) -> Message:
    if action.get("type") == "tool_call" and action.get("id"):
        return Message(role="assistant", content=raw, tool_calls=openai_tool_calls(action))
    if raw is None and action.get("type") == "tool_call":
        raw = agent_zero_json(action)
    return Message(role="assistant", content=raw if raw is not None else action.get("content", ""))


def _answer_message(action: dict[str, Any], text: str) -> Message:
    if action.get("type") == "tool_call" and action.get("id"):
        return Message(
            role="tool", content=text, tool_call_id=action["id"], name=action.get("name")
        )
    return Message(role="user", content=text)
