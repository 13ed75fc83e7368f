"""Trigger logic as pure objects (the service persists their state and publishes requests).

- Threshold: count newly rewarded trajectories (first reward version only, each
  (trajectory_id, version) once, whatever order the batches arrive in) per scope; reaching
  N fires and restarts the count.
- Schedule: a cron expression read by croniter, against an injectable clock. Firing times
  missed while the service was down collapse into one run at start.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from croniter import croniter

Clock = Callable[[], datetime]
NAMESPACE = uuid.UUID("6b1f3c8e-4d55-4e0c-9a63-3f3f2d0b7a11")


def utc_clock() -> datetime:
    return datetime.now(UTC)


def trigger_id(*parts: object) -> str:
    """A deterministic uuid for one firing, so a re-published request is the same job."""
    return str(uuid.uuid5(NAMESPACE, ":".join(str(p) for p in parts)))


@dataclass
class ThresholdState:
    """Counts since the last firing per scope key and how many times each scope fired (part
    of the request id). Which rewards were counted is kept beside it (the store's `counted`
    table), not as a stream position: a nakked batch comes back after later ones."""

    counts: dict[str, int] = field(default_factory=dict)
    fired: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"counts": self.counts, "fired": self.fired}

    @classmethod
    def from_json(cls, data: dict[str, object] | None) -> ThresholdState:
        if not data:
            return cls()
        return cls(
            counts=dict(data.get("counts") or {}),  # type: ignore[call-overload]
            fired=dict(data.get("fired") or {}),  # type: ignore[call-overload]
        )


def count_rewards(
    state: ThresholdState,
    items: Iterable[tuple[str, str, int]],
    threshold: int,
    counted: set[tuple[str, int]],
) -> list[tuple[str, int]]:
    """Feed (trajectory_id, scope_key, reward_version) rows; returns the scopes that fired
    with their firing number. A (trajectory_id, version) already in `counted` (a redelivery,
    a republished reward) and later reward versions (feedback re-scores) do not count; the
    pairs counted now are added to `counted`."""
    fired: list[tuple[str, int]] = []
    for tid, key, version in items:
        if version != 1 or threshold <= 0 or (tid, version) in counted:
            continue
        counted.add((tid, version))
        state.counts[key] = state.counts.get(key, 0) + 1
        if state.counts[key] >= threshold:
            state.counts[key] = 0
            state.fired[key] = state.fired.get(key, 0) + 1
            fired.append((key, state.fired[key]))
    return fired


@dataclass
class CronSchedule:
    """`due(last_fired)`: the newest firing time in (last_fired, now], or None."""

    expression: str
    clock: Clock = utc_clock

    def __post_init__(self) -> None:
        if not croniter.is_valid(self.expression):
            raise ValueError(f"invalid cron expression {self.expression!r}")

    def due(self, last_fired: datetime) -> datetime | None:
        now = self.clock()
        nxt = croniter(self.expression, last_fired).get_next(datetime)
        if nxt > now:
            return None
        # Several missed firings run once: report the newest one not after now.
        prev: datetime = croniter(self.expression, now).get_prev(datetime)
        if croniter.match(self.expression, now):
            prev = now.replace(second=0, microsecond=0)
        return max(prev, nxt)

    def next_after(self, when: datetime) -> datetime:
        result: datetime = croniter(self.expression, when).get_next(datetime)
        return result
