"""The one declared set of dataset filters, applied by both dataset sources.

A training request's `dataset.filter` holds the seed's fields plus `agent_ids` (set by the
per-agent threshold trigger; an extra field of the published schema). Both the JetStream
loader (`training.dataset.apply_filters`, in Python) and the warehouse source
(`warehouse.export.dataset_sql`, in SQL) read the filter through `declared()`, so a filter
cannot be honoured by one source and silently ignored by the other: a field outside
`FILTERS` is refused with a clear error instead.

Semantics (both sources):
  min_reward                    latest reward version's total >= min_reward
  max_trajectory_length         number of turns <= max_trajectory_length
  date_range                    start <= end_timestamp <= end
  task_domains                  the task's domain in the list (empty: all)
  exclude_subordinate_profiles  the subordinate profile not in the list
  agent_ids                     the trajectory's agent_id in the list (empty: all)
Trajectories whose user opted out (`metadata.rl_opt_out`) never enter a dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agentrl.contracts.training import DatasetFilter

FILTERS = (
    "min_reward",
    "max_trajectory_length",
    "date_range",
    "task_domains",
    "exclude_subordinate_profiles",
    "agent_ids",
)
EXTRA_FILTERS = ("agent_ids",)


@dataclass(frozen=True)
class DataFilter:
    """A request's dataset filter, validated and normalised."""

    min_reward: float | None = None
    max_trajectory_length: int | None = None
    start: datetime | None = None
    end: datetime | None = None
    task_domains: tuple[str, ...] = ()
    exclude_subordinate_profiles: tuple[str, ...] = ()
    agent_ids: tuple[str, ...] = ()


def declared(flt: DatasetFilter) -> DataFilter:
    """The filter as both sources apply it; ValueError for a field no source applies."""
    extra = dict(flt.model_extra or {})
    unknown = sorted(set(extra) - set(EXTRA_FILTERS))
    if unknown:
        raise ValueError(
            f"unknown dataset.filter field(s) {unknown}: the dataset sources apply only "
            f"{', '.join(FILTERS)}"
        )
    agents = extra.get("agent_ids") or []
    if not isinstance(agents, list) or not all(isinstance(a, str) for a in agents):
        raise ValueError("dataset.filter.agent_ids must be a list of agent id strings")
    rng = flt.date_range
    return DataFilter(
        min_reward=flt.min_reward,
        max_trajectory_length=flt.max_trajectory_length,
        start=rng.start if rng else None,
        end=rng.end if rng else None,
        task_domains=tuple(str(d) for d in flt.task_domains),
        exclude_subordinate_profiles=tuple(flt.exclude_subordinate_profiles),
        agent_ids=tuple(agents),
    )
