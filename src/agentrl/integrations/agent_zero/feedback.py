"""User feedback from Agent Zero -> `agent.rl.feedback.v1` (thumbs, rating, correction).

The reward service re-scores the trajectory with it (a new reward version). Feedback goes
through the same spool as trajectories, so a thumbs-up given while NATS is away is not lost
and arrives after the trajectory it is about.
"""

from __future__ import annotations

from typing import Any

from agentrl.contracts.base import utcnow
from agentrl.contracts.feedback import FeedbackEvent, FeedbackType
from agentrl.integrations.agent_zero.config import AgentZeroConfig
from agentrl.integrations.agent_zero.hooks import LAST_TRAJECTORY_KEY, outbox_for

KINDS: tuple[str, ...] = ("thumbs_up", "thumbs_down", "rating", "correction", "abandoned")


def feedback_event(
    trajectory_id: str,
    kind: FeedbackType,
    *,
    rating: int | None = None,
    comment: str | None = None,
    correction: str | None = None,
    session_id: str | None = None,
    user_id: str | None = None,
) -> FeedbackEvent:
    """The event (validated: a rating needs 1-5; a correction keeps the corrected answer)."""
    payload: dict[str, Any] = {
        "trajectory_id": trajectory_id,
        "timestamp": utcnow(),
        "type": kind,
        "rating": rating,
        "comment": comment,
        "session_id": session_id,
        "user_id": user_id,
        "source": "agent-zero",
    }
    if correction is not None:
        payload["correction"] = correction
    return FeedbackEvent.model_validate(payload)


def last_trajectory_id(context: Any) -> str | None:
    """The trajectory the chat's last monologue produced (what a thumbs button is about)."""
    get = getattr(context, "get_data", None)
    value = get(LAST_TRAJECTORY_KEY) if callable(get) else None
    return str(value) if value else None


async def send_feedback(config: AgentZeroConfig, event: FeedbackEvent) -> bool:
    """Spool and flush; True when it reached NATS now (else it waits in the spool)."""
    return await outbox_for(config).send([event]) > 0 and not len(outbox_for(config).spool)
