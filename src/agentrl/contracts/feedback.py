"""`agent.rl.feedback.v1`: user feedback that arrives after its trajectory (added to the seed)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from agentrl.contracts.base import Event, Id, Timestamp, new_id

# "comment": free text that changes no score (agentrl.capture's TensorZero-style feedback)
FeedbackType = Literal["thumbs_up", "thumbs_down", "rating", "correction", "abandoned", "comment"]


class FeedbackEvent(Event):
    """Added to the seed (no published schema): top-level extras are kept as they are."""

    SUBJECT: ClassVar[str] = "agent.rl.feedback.v1"
    ID_FIELD: ClassVar[str | None] = "feedback_id"
    FOLD_INTO: ClassVar[str | None] = None

    feedback_id: Id = Field(default_factory=new_id)
    trajectory_id: Id
    session_id: str | None = None
    user_id: str | None = None
    timestamp: Timestamp
    type: FeedbackType
    rating: int | None = Field(None, ge=1, le=5)
    comment: str | None = None
    correction: str | None = Field(
        None,
        description="Free text beside any type: what the agent should have done or answered "
        "(redacted like all feedback; stored with the reward; jobs read it as the task's hint).",
    )

    @model_validator(mode="after")
    def _rating_given(self) -> FeedbackEvent:
        if self.type == "rating" and self.rating is None:
            raise ValueError("rating (1-5) is required when type is 'rating'")
        return self
