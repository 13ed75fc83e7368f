"""TensorZero-style feedback: a metric name and a value for an episode, a completion or a
trajectory, read as agentrl's feedback kinds.

The value decides the kind: a boolean is a thumbs up/down, a float in [0, 1] a rating
(1 + 4·value, rounded), a string a comment (the metric "demonstration": the response the
agent should have given, i.e. a correction). The metric's own name and value travel with the
event, so nothing the caller said is lost. An episode or completion id is resolved through the
capture index: a completion to its trajectory, an episode to every trajectory published
under it (feedback reaches them all, and the answer names them).
"""

from __future__ import annotations

from typing import Any

from agentrl.capture.index import COMPLETION, EPISODE, TrajectoryIndex

DEMONSTRATION = "demonstration"
COMMENT = "comment"


class FeedbackValueError(ValueError):
    """The metric's value cannot be read as feedback (the message says why)."""


def fields_for(metric_name: str, value: Any) -> dict[str, Any]:
    """`type` (and `rating`, `comment` or `correction`) of the feedback event for one metric."""
    if metric_name == DEMONSTRATION:
        if not isinstance(value, str) or not value.strip():
            raise FeedbackValueError(
                "a demonstration's value is the response the agent should give"
            )
        return {"type": "correction", "correction": value}
    if isinstance(value, bool):
        return {"type": "thumbs_up" if value else "thumbs_down"}
    if isinstance(value, int | float):
        v = float(value)
        if not 0.0 <= v <= 1.0:
            raise FeedbackValueError(
                f"a float metric is a score in [0, 1] (got {value}); send a boolean for "
                "thumbs, a string for a comment"
            )
        return {"type": "rating", "rating": 1 + round(4 * v)}
    if isinstance(value, str):
        if not value.strip():
            raise FeedbackValueError("an empty comment")
        return {"type": COMMENT, "comment": value}
    raise FeedbackValueError(
        f"value must be a boolean, a number in [0, 1] or a string, not {type(value).__name__}"
    )


async def resolve(
    js: Any,
    bucket: str,
    ttl_s: float,
    *,
    episode_id: str | None = None,
    completion_id: str | None = None,
) -> list[str]:
    """The trajectory ids feedback reaches: a completion's one, or every trajectory
    published under an episode id (empty: not published yet)."""
    index = await TrajectoryIndex.open(js, bucket, ttl_s)
    if completion_id:
        found = await index.get(COMPLETION, completion_id)
        if found:
            return [found]
    if episode_id:
        return await index.all(EPISODE, episode_id)
    return []
