"""User feedback from Agent Zero -> `agent.rl.feedback.v1` (thumbs, rating, correction).

The reward service re-scores the trajectory with it (a new reward version). Feedback goes
through the same spool as trajectories, so a thumbs-up given while NATS is away is not lost
and arrives after the trajectory it is about.

In the web UI every message gets thumbs up/down (the plugin's
`extensions/webui/set_messages_after_loop/agentrl-thumbs.js`), which call the plugin's API
`/plugins/agentrl/feedback` (`api/feedback.py` -> `feedback_from_ui`): the message's log
number finds the main monologue that wrote it (the chat's spans, kept by `hooks`), so the
thumb lands on that trajectory. A thumbs-down first offers a one-line "what should it have
done?" box; its text goes with the thumb as the event's `correction` (masked against Agent
Zero's secrets and redacted like all feedback). Implicit signals come from `hooks`: a retry (the same
question again) is a `correction`, a stopped or reset chat `abandoned`.
"""

from __future__ import annotations

from typing import Any

from agentrl.contracts.base import utcnow
from agentrl.contracts.feedback import FeedbackEvent, FeedbackType
from agentrl.integrations.agent_zero import masking
from agentrl.integrations.agent_zero.config import AgentZeroConfig
from agentrl.integrations.agent_zero.state import (
    LAST_TRAJECTORY_KEY,
    SPANS_KEY,
    config_for,
    outbox_for,
)

KINDS: tuple[str, ...] = ("thumbs_up", "thumbs_down", "rating", "correction", "abandoned")
UI_KINDS = ("thumbs_up", "thumbs_down")


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


def trajectory_for(context: Any, log_no: Any = None) -> str | None:
    """The trajectory of the main monologue that wrote log item `log_no` (the chat's last
    one when no number is given or none matches)."""
    get = getattr(context, "get_data", None)
    spans = get(SPANS_KEY) if callable(get) else None
    if isinstance(log_no, int) and isinstance(spans, list):
        for start, end, trajectory_id in spans:
            if start <= log_no <= end:
                return str(trajectory_id)
        later = [s for s in spans if s[0] > log_no]
        if later:  # a message logged before the monologue's first hook ran (the user's)
            return str(later[0][2])
    return last_trajectory_id(context)


MAX_CORRECTION_CHARS = 4000


async def feedback_from_ui(
    context: Any,
    kind: Any,
    log_no: Any,
    comment: Any,
    plugin_file: str,
    correction: Any = None,
) -> dict[str, Any]:
    """A thumb from the web UI: `{"ok", "trajectory_id", "published"}` or `{"ok": False,
    "message"}` (no trajectory yet, opted out, an unknown kind). A thumbs-down may carry the
    user's one-line `correction` ("what should it have done?"), sent in the same event."""
    if kind not in UI_KINDS:
        return {"ok": False, "message": f"kind must be one of {', '.join(UI_KINDS)}"}
    agent0 = getattr(context, "agent0", None)
    config = config_for(plugin_file, agent0) if agent0 is not None else config_for(plugin_file)
    if not config.enabled or config.opt_out:
        return {"ok": False, "message": "this chat is not recorded for training (opted out)"}
    number = log_no if isinstance(log_no, int) else None
    trajectory_id = trajectory_for(context, number)
    if trajectory_id is None:
        return {"ok": False, "message": "no recorded answer in this chat yet"}
    fixed = str(correction).strip()[:MAX_CORRECTION_CHARS] if correction else ""
    event = feedback_event(
        trajectory_id,
        kind,
        comment=str(comment) if comment else None,
        correction=fixed or None,
        session_id=str(getattr(context, "id", "") or "") or None,
    )
    event = masking.mask_event(event, masking.secrets_of(context))
    published = await send_feedback(config, event)
    return {"ok": True, "trajectory_id": trajectory_id, "published": published}
