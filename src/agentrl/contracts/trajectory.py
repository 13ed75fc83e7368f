"""`agent.rl.trajectory.v1`: one multi-turn interaction of an agent (seed 000, section 1).

Compatible additions (optional, absent unless used): `turns[].thread` and
`metadata.threads`, the linked conversations of one episode captured at the gateway.
The `outcome` block agentrl adds travels as `metadata.outcome` (the published schema allows
no extra top-level field); `TrajectoryEvent.outcome` still reads it, and a top-level
`outcome` on input is moved there with a DeprecationWarning.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from agentrl.contracts.base import (
    Event,
    Finite,
    Id,
    NonNegative,
    Part,
    Score01,
    Timestamp,
    new_id,
    noop_when_valid,
)

ObservationType = Literal["user_message", "tool_result", "subordinate_response", "system_message"]
ActionType = Literal["tool_call", "subordinate_call", "response", "memory_update"]
Domain = Literal["coding", "research", "data_analysis", "general", "debugging", "writing"]
# The profiles PMOVES's schema names; other Agent Zero profiles travel in metadata.agent_profile.
SUBORDINATE_PROFILES = ("researcher", "developer", "hacker", "rl-trainer")
TaskStatus = Literal["completed_successfully", "partial_completion", "failed"]
FeedbackKind = Literal["thumbs_up", "thumbs_down", "rating"]


class ObservationContext(Part):
    memory_state: dict[str, Any] = Field(default_factory=dict)
    available_tools: list[Any] = Field(default_factory=list)
    subordinates_active: int = Field(0, ge=0)


class Observation(Part):
    type: ObservationType
    content: Any = Field(description="A string or any JSON object (null reads as '').")
    context: ObservationContext | None = None

    @field_validator("content", mode="after")
    @classmethod
    def _content_not_null(cls, value: Any) -> Any:
        # required on the wire, where null is not allowed: an empty observation is ""
        # (an after-validator of the field, so JSON validation never materialises the turn)
        return "" if value is None else value


class Action(Part):
    type: ActionType
    tool_name: str | None = None
    tool_args: dict[str, Any] = Field(default_factory=dict)
    raw_response: str | None = None


class TurnResult(Part):
    success: bool
    output: Any = None
    error: str | None = None
    execution_time_ms: NonNegative | None = None


class Turn(Part):
    turn_id: int = Field(ge=1, description="Counts from 1, as in the seed.")
    timestamp: Timestamp
    observation: Observation
    thought_process: list[str] = Field(default_factory=list)
    action: Action
    result: TurnResult | None = None
    thread: int | None = Field(
        None,
        ge=1,
        description="agentrl's addition: which conversation of the episode the turn belongs "
        "to (1, 2, ...: a crew's task, a sub-agent, a retry); see metadata.threads.",
    )


class Thread(Part):
    """agentrl's addition: one conversation inside an episode (an agent run that held
    several: a crew's tasks, a sub-agent, a retry with another prompt), in start order."""

    thread: int = Field(ge=1)
    parent: int | None = Field(
        None, ge=1, description="The thread that was active when this one started."
    )
    opened_by: str = Field(
        "start", description="start | conversation (a fresh history) | branch | resumed."
    )
    task: str = ""
    turns: int = Field(0, ge=0)


class TaskContext(Part):
    task_id: Id
    instructions: str
    complexity_score: Score01 | None = None
    domain: Domain = "general"


class UserFeedback(Part):
    type: FeedbackKind
    rating: int | None = Field(None, ge=1, le=5)

    @model_validator(mode="after")
    def _rating_given(self) -> UserFeedback:
        if self.type == "rating" and self.rating is None:
            raise ValueError("user_feedback.rating (1-5) is required when type is 'rating'")
        return self


class Outcome(Part):
    """Added to the seed's payload: the seed's reward functions read these fields."""

    task_status: TaskStatus
    completion_percentage: Score01 = 0.0
    user_feedback: UserFeedback | None = None
    correction_requested: bool = False
    task_abandoned: bool = False
    test_results: dict[str, int] | None = Field(
        None, description="{'passed': n, 'total': m} when the agent ran tests."
    )


class TrajectoryMetadata(Part):
    model: str = Field("unknown", description="Required by the published schema.")
    temperature: NonNegative | None = None
    total_tokens: int | None = Field(None, ge=0)
    total_cost_usd: NonNegative | None = None
    rl_opt_out: bool = False
    outcome: Outcome | None = Field(None, description="agentrl's addition (was top-level).")
    threads: list[Thread] | None = Field(
        None, description="agentrl's addition: the conversations of the episode, in order."
    )

    @model_validator(mode="before")
    @classmethod
    @noop_when_valid  # null fails `model: str`
    def _model_named(cls, data: Any) -> Any:
        # `model: null` was valid once; the published schema requires a name
        if isinstance(data, dict) and "model" in data and data["model"] is None:
            data = {k: v for k, v in data.items() if k != "model"}
        return data


class TrajectoryEvent(Event):
    SUBJECT: ClassVar[str] = "agent.rl.trajectory.v1"
    ID_FIELD: ClassVar[str | None] = "trajectory_id"
    MOVED: ClassVar[dict[str, tuple[str, str]]] = {"outcome": ("metadata", "outcome")}

    trajectory_id: Id = Field(default_factory=new_id)
    session_id: Id
    agent_id: Id
    subordinate_profile: str | None = None
    start_timestamp: Timestamp
    end_timestamp: Timestamp
    turns: list[Turn] = Field(min_length=1)
    task_context: TaskContext
    metadata: TrajectoryMetadata = Field(default_factory=TrajectoryMetadata)

    @property
    def outcome(self) -> Outcome | None:
        """agentrl's outcome block (it travels as `metadata.outcome`)."""
        return self.metadata.outcome

    @model_validator(mode="after")
    def _ordered(self) -> TrajectoryEvent:
        if self.end_timestamp < self.start_timestamp:
            raise ValueError("end_timestamp is before start_timestamp")
        return self


__all__ = [
    "SUBORDINATE_PROFILES",
    "Action",
    "Domain",
    "Finite",
    "Observation",
    "ObservationContext",
    "Outcome",
    "TaskContext",
    "Thread",
    "TrajectoryEvent",
    "TrajectoryMetadata",
    "Turn",
    "TurnResult",
    "UserFeedback",
]
