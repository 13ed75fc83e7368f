"""The subject registry: each subject's payload model and the stream that keeps it."""

from __future__ import annotations

from agentrl.contracts.base import Event
from agentrl.contracts.deployment import HOLD_PREFIX, ModelDeployed
from agentrl.contracts.feedback import FeedbackEvent
from agentrl.contracts.reward import RewardEvent
from agentrl.contracts.streams import StreamSpec, stream_for
from agentrl.contracts.training import TrainingRequest, TrainingStatus
from agentrl.contracts.trajectory import TrajectoryEvent

TRAJECTORY = TrajectoryEvent.SUBJECT
REWARD = RewardEvent.SUBJECT
TRAINING_REQUEST = TrainingRequest.SUBJECT
TRAINING_STATUS = TrainingStatus.SUBJECT
MODEL_DEPLOYED = ModelDeployed.SUBJECT
FEEDBACK = FeedbackEvent.SUBJECT
# core NATS request/reply, no stream: `HOLD_PREFIX.<public name>` (`hold_subject`), payload
# `HoldRequest`, answer `HoldReply`
DEPLOY_HOLD = HOLD_PREFIX

MODELS: dict[str, type[Event]] = {
    model.SUBJECT: model
    for model in (
        TrajectoryEvent,
        RewardEvent,
        TrainingRequest,
        TrainingStatus,
        ModelDeployed,
        FeedbackEvent,
    )
}


def model_for(subject: str) -> type[Event] | None:
    """The payload model of `subject`, or None for subjects without a contract."""
    return MODELS.get(subject)


def stream_of(subject: str) -> StreamSpec:
    return stream_for(subject)
