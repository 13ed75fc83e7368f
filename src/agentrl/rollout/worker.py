"""`RLRolloutWorker` (seed 002, Tasks 2.1 and 2.3): one agent, one environment, one episode.

The loop follows the seed's steps A-I:
  A. reset the environment with the task's seed; history = task messages + first observation
  B. `_prepare_policy_observation`: the task messages, the first observation and the last
     `history_window` turns (the first observation is left out when the environment says
     each of its observations stands alone: `observation_stands_alone`)
  C. `policy.get_action(observation, tool_specs)`
  D. `_execute_action_in_environment`: the action as text -> `env.step`
  E. history += the assistant message and the environment's answer
  F. `_check_termination`: a critical error, the environment's done, a terminate action,
     the task's termination regex on the raw output, or the step limit
  G. collect a `StepData`, H. count the step, I. return (steps, messages, ground_truth)

Nothing in an episode raises: unparsable output is an invalid-action step, and a policy
or environment failure ends the episode with `step_info["critical_error"]`.
`run_group` runs n episodes of one task and seed concurrently: GiGPO's group.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agentrl.envs.base import TextEnv
from agentrl.rollout.context import EpisodeContext, reset_current_episode, set_current_episode
from agentrl.rollout.models import Message, StepData, TaskDefinition
from agentrl.rollout.parsing import action_to_text, openai_tool_calls
from agentrl.rollout.policy import AgentPolicy

log = logging.getLogger(__name__)

EnvFactory = Callable[..., TextEnv]  # env_factory(env_id, **env_kwargs), like envs.make_env

# Why an episode ended (step_info["termination_reason"] of its last step).
CRITICAL_ERROR = "critical_error"
ENV_DONE = "env_done"
TERMINATE_ACTION = "terminate_action"
TERMINATION_REGEX = "termination_regex"
MAX_STEPS = "max_steps"


def default_env_factory(env_id: str, **kwargs: Any) -> TextEnv:
    from agentrl.envs import make_env  # imported late: envs may pull in gymnasium

    env: TextEnv = make_env(env_id, **kwargs)
    return env


@dataclass
class ExecutionOutcome:
    """What executing one action did (step D's `action_execution_info` and messages)."""

    info: dict[str, Any]
    assistant_message: Message
    response_messages: list[Message] = field(default_factory=list)
    observation: dict[str, Any] | None = None
    reward: float = 0.0
    env_done: bool = False


@dataclass
class Episode:
    """One finished episode with its identity; `as_tuple()` is `run_episode`'s return."""

    steps: list[StepData]
    messages: list[Message]
    ground_truth: Any
    task: TaskDefinition
    episode_id: str
    group_id: str
    episode_index: int = 0
    termination_reason: str | None = None
    reset_error: str | None = None  # the environment could not even start
    start_time: datetime = field(default_factory=lambda: datetime.now(UTC))
    end_time: datetime = field(default_factory=lambda: datetime.now(UTC))

    def as_tuple(self) -> tuple[list[StepData], list[Message], Any]:
        return self.steps, self.messages, self.ground_truth

    @property
    def total_reward(self) -> float:
        return float(sum(s.base_reward or 0.0 for s in self.steps))

    @property
    def success(self) -> bool:
        return bool(self.steps and self.steps[-1].step_info.get("success"))

    @property
    def critical_error(self) -> str | None:
        if self.reset_error is not None:
            return self.reset_error
        return self.steps[-1].step_info.get("critical_error") if self.steps else None


class RLRolloutWorker:
    """Runs episodes of `task` with `policy` in environments from `env_factory`.

    history_window: how many past turns (assistant message + environment answer) the
    policy sees besides the task messages and the first observation; None = all, 0 = only
    the current observation. An environment whose `observation_stands_alone` is true (each
    observation holds what the first one did, e.g. FrozenLake's egocentric text) gets no
    first observation in a windowed prompt: the same state then gives the same prompt in
    every episode, which a valid-action policy scores once. max_episode_steps overrides the
    task's limit when given.
    env_in_thread runs `env.reset/step` in a worker thread so slow tools (a code sandbox)
    do not stall the other episodes of a group.
    """

    def __init__(
        self,
        task: TaskDefinition,
        policy: AgentPolicy,
        env_factory: EnvFactory | None = None,
        *,
        history_window: int | None = None,
        max_episode_steps: int | None = None,
        episode_id: str | None = None,
        group_id: str | None = None,
        episode_index: int = 0,
        env_in_thread: bool = True,
    ) -> None:
        if history_window is not None and history_window < 0:
            raise ValueError("history_window must be None (everything) or >= 0")
        self.task = task
        self.agent_policy = policy
        self.env_factory = env_factory or default_env_factory
        self.history_window = history_window
        self.max_episode_steps = (
            max_episode_steps if max_episode_steps is not None else task.max_episode_steps
        )
        if self.max_episode_steps < 1:
            raise ValueError("max_episode_steps must be >= 1")
        self.termination_pattern = (
            re.compile(task.termination_regex) if task.termination_regex else None
        )
        self.episode_id = episode_id or str(uuid.uuid4())  # canonical: the trajectory_id
        self.group_id = group_id or str(uuid.uuid4())
        self.episode_index = episode_index
        self.env_in_thread = env_in_thread
        # Per-episode state (A).
        self.env: TextEnv | None = None
        self.current_messages_history: list[Message] = []
        self.collected_step_data: list[StepData] = []
        self._prefix_len = 0
        self._turn_starts: list[int] = []  # index of each turn's assistant message
        self._last_answer_start = 0  # index of the latest environment answer

    # ---- environment calls ---------------------------------------------------------------
    async def _env_call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.env_in_thread:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    # ---- B -------------------------------------------------------------------------------
    def _prepare_policy_observation(self, history: list[Message]) -> list[Message]:
        """Task messages + first observation + the last `history_window` turns."""
        k = self.history_window
        if k is None or len(self._turn_starts) <= k:
            return list(history)
        prefix = history[: self._prefix_len]
        if getattr(self.env, "observation_stands_alone", False):
            prefix = prefix[:-1]  # the first observation: the latest one says all it did
        if k == 0:
            return prefix + history[self._last_answer_start :]
        return prefix + history[self._turn_starts[-k] :]

    # ---- D -------------------------------------------------------------------------------
    async def _execute_action_in_environment(
        self, action: dict[str, Any], raw_policy_output: str | None
    ) -> ExecutionOutcome:
        """Send the action to the environment; never raises (failures are critical errors)."""
        kind = action.get("type")
        info: dict[str, Any] = {}
        if kind == "invalid":
            info["parse_error"] = action.get("error")
        if kind == "terminate":
            assistant = Message(role="assistant", content=raw_policy_output or "")
            return ExecutionOutcome(info={"terminated_by_agent": True}, assistant_message=assistant)
        action_text = action_to_text(action, raw_policy_output)
        native_call = kind == "tool_call" and action.get("id") is not None
        if native_call:
            assistant = Message(
                role="assistant", content=raw_policy_output, tool_calls=openai_tool_calls(action)
            )
        else:
            content = raw_policy_output if raw_policy_output is not None else action_text
            assistant = Message(role="assistant", content=content)
        assert self.env is not None
        started = time.perf_counter()
        try:
            obs, reward, done, env_info = await self._env_call(self.env.step, action_text)
            if not isinstance(obs, dict):
                raise TypeError(f"step returned {type(obs).__name__}, not an observation dict")
            reward = float(reward)
        except Exception as exc:
            log.exception("environment %s failed on step", self.task.env_id)
            info.update(
                critical_error=f"environment step failed: {type(exc).__name__}: {exc}",
                error_source="environment",
                execution_time_ms=(time.perf_counter() - started) * 1000.0,
            )
            return ExecutionOutcome(info=info, assistant_message=assistant)
        info.update(env_info or {})
        info.setdefault("invalid_action", kind == "invalid")
        info["execution_time_ms"] = (time.perf_counter() - started) * 1000.0
        text = str(obs.get("text", ""))
        if native_call:
            answer = Message(
                role="tool", content=text, tool_call_id=action["id"], name=action.get("name")
            )
        else:
            answer = Message(role="user", content=text)
        return ExecutionOutcome(
            info=info,
            assistant_message=assistant,
            response_messages=[answer],
            observation=obs,
            reward=reward,
            env_done=bool(done),
        )

    # ---- F -------------------------------------------------------------------------------
    def _check_termination(
        self,
        step_index: int,
        action: dict[str, Any],
        raw_policy_output: str | None,
        action_execution_info: dict[str, Any],
        env_done: bool = False,
    ) -> str | None:
        """The reason this step ends the episode, or None to go on (first match wins)."""
        if action_execution_info.get("critical_error"):
            return CRITICAL_ERROR
        if env_done:
            return ENV_DONE
        if action.get("type") == "terminate":
            return TERMINATE_ACTION
        if self.termination_pattern is not None:
            text = raw_policy_output
            if text is None:
                text = action.get("content") if action.get("type") == "text" else None
            if text is not None and self.termination_pattern.search(text):
                return TERMINATION_REGEX
        if step_index + 1 >= self.max_episode_steps:
            return MAX_STEPS
        return None

    # ---- the episode ---------------------------------------------------------------------
    async def run_episode(self) -> tuple[list[StepData], list[Message], Any]:
        """The seed's interface: (steps, messages for the reward function, ground truth)."""
        return (await self.run()).as_tuple()

    async def run(self) -> Episode:
        """Run one episode and return it with its ids and why it ended."""
        task = self.task
        start_time = datetime.now(UTC)
        # A. initialise
        self.collected_step_data = []
        self.current_messages_history = list(task.initial_messages)
        self._turn_starts = []
        try:
            self.env = self.env_factory(task.env_id, **task.env_kwargs)
            obs: dict[str, Any] = await self._env_call(self.env.reset, seed=task.seed)
            if not isinstance(obs, dict):
                raise TypeError(f"reset returned {type(obs).__name__}, not an observation dict")
        except Exception as exc:
            log.exception("environment %s failed to start", task.env_id)
            return self._episode(start_time, f"environment reset failed: {exc}")
        self.current_messages_history.append(Message(role="user", content=str(obs.get("text", ""))))
        self._prefix_len = len(self.current_messages_history)
        self._last_answer_start = self._prefix_len - 1
        tools = task.tool_specs or None
        reason: str | None = None
        for step_index in range(self.max_episode_steps):
            # B. the policy's view
            step_started = datetime.now(UTC)
            window = self._prepare_policy_observation(self.current_messages_history)
            observation_data = {
                "anchor": obs.get("anchor"),
                "env_observation": obs,
                "messages": [m.to_openai() for m in window],
            }
            # C. the action
            token = set_current_episode(
                EpisodeContext(self.episode_id, self.group_id, self.episode_index, step_index)
            )
            try:
                action, raw, log_probs, value = await self.agent_policy.get_action(window, tools)
                policy_error = None
            except Exception as exc:
                log.warning("policy failed at step %d: %s", step_index, exc)
                action, raw, log_probs, value = (
                    {"type": "invalid", "error": str(exc)},
                    None,
                    None,
                    None,
                )
                policy_error = f"policy failed: {type(exc).__name__}: {exc}"
            finally:
                reset_current_episode(token)
            # D. the environment
            if policy_error is not None:
                outcome = ExecutionOutcome(
                    info={"critical_error": policy_error, "error_source": "policy"},
                    assistant_message=Message(role="assistant", content=""),
                )
            else:
                outcome = await self._execute_action_in_environment(action, raw)
            # E. history
            if policy_error is None:
                self._turn_starts.append(len(self.current_messages_history))
                self.current_messages_history.append(outcome.assistant_message)
                self._last_answer_start = len(self.current_messages_history)
                self.current_messages_history.extend(outcome.response_messages)
            # F. termination
            reason = self._check_termination(
                step_index, action, raw, outcome.info, env_done=outcome.env_done
            )
            info = {
                **outcome.info,
                "episode_id": self.episode_id,
                "group_id": self.group_id,
                "timestamp": step_started.isoformat(),
            }
            if reason is not None:
                info["termination_reason"] = reason
                info["truncated"] = reason == MAX_STEPS or bool(info.get("truncated"))
            # G. collect
            self.collected_step_data.append(
                StepData(
                    system_step_index=step_index,
                    observation_data=observation_data,
                    action_taken=action,
                    raw_policy_output=raw,
                    resulting_messages_history=list(self.current_messages_history),
                    policy_logprobs=log_probs,
                    policy_value_estimate=value,
                    is_done=reason is not None,
                    step_info=info,
                    base_reward=outcome.reward,
                )
            )
            if outcome.observation is not None:
                obs = outcome.observation
            # H. next step, unless done
            if reason is not None:
                break
        # I. return
        return self._episode(start_time, None, reason)

    def _episode(
        self, start_time: datetime, reset_error: str | None, reason: str | None = None
    ) -> Episode:
        ground_truth = self.task.ground_truth
        if ground_truth is None and self.env is not None:
            ground_truth = getattr(self.env, "ground_truth", None)
        if reset_error is not None:
            reason = CRITICAL_ERROR
        episode = Episode(
            steps=self.collected_step_data,
            messages=self.current_messages_history,
            ground_truth=ground_truth,
            task=self.task,
            episode_id=self.episode_id,
            group_id=self.group_id,
            episode_index=self.episode_index,
            termination_reason=reason,
            reset_error=reset_error,
            start_time=start_time,
            end_time=datetime.now(UTC),
        )
        return episode

    async def run_group(self, n: int) -> list[Episode]:
        """n concurrent episodes of this worker's task and seed (a GiGPO group)."""
        return await run_group(
            self.task,
            n,
            self.agent_policy,
            env_factory=self.env_factory,
            history_window=self.history_window,
            max_episode_steps=self.max_episode_steps,
            env_in_thread=self.env_in_thread,
        )


async def run_group(
    task: TaskDefinition,
    n: int,
    policy: AgentPolicy,
    *,
    env_factory: EnvFactory | None = None,
    group_id: str | None = None,
    **worker_kwargs: Any,
) -> list[Episode]:
    """Run n episodes of `task` (same environment seed) concurrently with one policy.

    They share a group_id, so GiGPO compares them; a batching policy (HFAgentPolicy) sees
    their calls together and generates for them in one batch.
    """
    if n < 1:
        raise ValueError("a group needs n >= 1 episodes")
    gid = group_id or str(uuid.uuid4())
    workers = [
        RLRolloutWorker(task, policy, env_factory, group_id=gid, episode_index=i, **worker_kwargs)
        for i in range(n)
    ]
    return list(await asyncio.gather(*(w.run() for w in workers)))
