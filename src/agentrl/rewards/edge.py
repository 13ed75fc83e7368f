"""Publishing trajectories with their PII scrubbed first: the producer side of redaction.

The seed says PII is scrubbed before storage; RL_TRAJECTORIES keeps trajectories for 30 days
and training reads them, so every producer agentrl ships redacts before publishing (the
rollout conversion, this helper, the Agent Zero plugin) and the reward service redacts again
as the second line. An external producer does the same: call
`agentrl.rewards.redact.redact_event(event)` on each event before `Bus.publish`, or publish
through `publish_redacted` below (any language: apply equivalent scrubbing, or route through
an agentrl process).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from agentrl.rewards.redact import Redactor, redact_event


async def publish_redacted(
    bus: Any, events: Iterable[Any], redactor: Redactor | None = None
) -> dict[str, int]:
    """Redact each event (`redact_event`) and publish them all (`bus.publish_many`, pipelined,
    Msg-Id = event id); returns the redactions per kind."""
    counts: Counter[str] = Counter()
    clean = []
    for event in events:
        cleaned, found = redact_event(event, redactor)
        counts.update(found)
        clean.append(cleaned)
    if clean:
        await bus.publish_many(clean)
    return dict(counts)
