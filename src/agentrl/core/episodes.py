"""Data models of multi-step episodes (seed 002, Task 2.1-2.4), at the bottom of the
import graph: environments, advantages, rollouts and trainers all import them downward
(`agentrl.rollout.models` re-exports them for existing code).

`Message` is the OpenAI chat shape; `StepData` is one environment step with everything a
trainer needs; `TaskDefinition` says what an episode is. Dataclasses: they live inside a
process. Crossing a process boundary goes through `agentrl.contracts` payloads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass
class Message:
    """One chat message in OpenAI format."""

    role: Role
    content: str | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def to_openai(self) -> dict[str, Any]:
        """The dict the OpenAI API and chat templates expect (None fields dropped)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_openai(cls, data: dict[str, Any]) -> Message:
        return cls(
            role=data["role"],
            content=data.get("content"),
            name=data.get("name"),
            tool_call_id=data.get("tool_call_id"),
            tool_calls=data.get("tool_calls"),
        )


@dataclass
class StepData:
    """One step of an episode, as the seed's Task 2.1 step G collects it."""

    system_step_index: int
    observation_data: Any
    action_taken: dict[str, Any]
    raw_policy_output: str | None = None
    resulting_messages_history: list[Message] = field(default_factory=list)
    policy_logprobs: dict[str, Any] | None = None
    policy_value_estimate: float | None = None
    is_done: bool = False
    step_info: dict[str, Any] = field(default_factory=dict)
    base_reward: float | None = None
    advantage: float | None = None
    return_to_go: float | None = None


@dataclass
class TaskDefinition:
    """What one episode is: the environment, its seed, the opening messages and the rules."""

    name: str
    env_id: str
    seed: int = 0
    initial_messages: list[Message] = field(default_factory=list)
    tool_specs: list[dict[str, Any]] = field(default_factory=list)
    ground_truth: Any = None
    max_episode_steps: int = 15
    termination_regex: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
