"""The settings of the warehouse commands: `agentrl stats ...`, `agentrl warehouse
migrate|serve|export` and `agentrl bench warehouse` draw their options from these models'
fields and docstrings (`agentrl.core.configcli`), the warehouse's own from `WarehouseSettings`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrl.contracts.training import DatasetFilter
from agentrl.warehouse.config import WarehouseSettings


class _Options(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


class IngesterOptions(WarehouseSettings):
    """`agentrl warehouse serve`: the warehouse settings and the bus."""

    nats_url: str | None = Field(None, description="NATS server (default: NATS_URL).")


class StatsQuery(_Options):
    """One `agentrl stats QUERY`; each query reads the fields it names."""

    as_json: bool = False
    """Print JSON instead of a table."""
    since: datetime | None = None
    """From this time (ISO 8601, UTC)."""
    until: datetime | None = None
    """Until this time (ISO 8601, UTC)."""
    model: str | None = None
    """Only this model version (success, lengths)."""
    domain: str | None = None
    """Only this domain (lengths)."""
    bucket_s: int = Field(3600, ge=1)
    """Bucket width in seconds (success)."""
    limit: int = Field(10, ge=1)
    """Rows (tools, failing-tools)."""
    api: str | None = None
    """Control API URL (default: read the warehouse here)."""

    def params(self, name: str) -> dict[str, Any]:
        """The keyword arguments of query `name`."""
        window = {"since": self.since, "until": self.until}
        if name == "success":
            return {**window, "model": self.model, "bucket_s": self.bucket_s}
        if name == "lengths":
            return {**window, "model": self.model, "domain": self.domain}
        if name in ("tools", "failing-tools"):
            return {"limit": self.limit}
        return window if name in ("rewards", "feedback") else {}


class ExportOptions(_Options):
    """`agentrl warehouse export`: a training request's filter, a sample, a format."""

    min_reward: float | None = None
    """Latest reward >= this."""
    max_length: int | None = Field(None, ge=1)
    """At most this many turns."""
    start: datetime | None = None
    """Ended at or after (ISO 8601, UTC)."""
    end: datetime | None = None
    """Ended at or before (ISO 8601, UTC)."""
    domain: list[str] = Field(default_factory=list)
    """Task domain."""
    exclude_profile: list[str] = Field(default_factory=list)
    """Subordinate profile to leave out."""
    sample_size: int | None = Field(None, ge=1)
    """At most this many (deterministic sample)."""
    seed: int = 0
    """Sample seed."""
    include_raw: bool = True
    """Include the trajectory JSON, not only the summary columns."""
    api: str | None = None
    """Export through this control API instead."""

    def dataset_filter(self) -> DatasetFilter:
        """The filter a training request would carry."""
        filt: dict[str, Any] = {
            "min_reward": self.min_reward,
            "max_trajectory_length": self.max_length,
            "task_domains": self.domain,
            "exclude_subordinate_profiles": self.exclude_profile,
        }
        if self.start or self.end:
            filt["date_range"] = {
                "start": (self.start or datetime(1970, 1, 1)).replace(tzinfo=UTC).isoformat(),
                "end": (self.end or datetime(2299, 1, 1)).replace(tzinfo=UTC).isoformat(),
            }
        return DatasetFilter.model_validate({k: v for k, v in filt.items() if v is not None})

    @model_validator(mode="after")
    def _a_valid_filter(self) -> ExportOptions:
        try:
            self.dataset_filter()
        except ValidationError as exc:
            raise ValueError(str(exc)) from None
        return self


class WarehouseBench(_Options):
    """Ingest from JetStream into chdb (>= 20,000 turns/s), analytics queries on
    1,000,000 turns (p50 < 200 ms, p99 < 1 s), export of 100,000 filtered trajectories
    to Parquet (< 2 s). Last line: turns_per_s, query_p50_ms, query_p99_ms, export_s, lost."""

    n: int = Field(20_000, ge=1)
    """Trajectories to ingest."""
    repeat: int = Field(30, ge=1)
    """Runs per query."""
    trajectories: int = Field(200_000, ge=1)
    """Trajectories in the analytics tables (about 1,000,000 turns)."""

    @classmethod
    def quick(cls, **kw: Any) -> WarehouseBench:
        """5,000 trajectories ingested, 10 query runs."""
        return cls(**{"n": 5_000, "repeat": 10, **kw})
