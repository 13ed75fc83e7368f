"""The settings of `agentrl train ...` and `agentrl bench training`: the commands draw their
options from these models' fields and docstrings (`agentrl.core.configcli`); `--set FIELD=VALUE`
reaches the fields without an option."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Connection(BaseModel):
    """Where the commands send their calls: the control API, or NATS with `nats`."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    api: str | None = None
    """Control API URL (default from settings)."""
    token: str | None = None
    """Bearer token (default: AGENTRL_API_TOKEN)."""
    nats: str | None = None
    """Talk to NATS at this URL instead of the API."""


class StartOptions(Connection):
    """`agentrl train start`: a manual training request."""

    config: Path | None = None
    """JSON/YAML with request fields."""
    base_model: str | None = None
    """e.g. smollm2, tiny, or a HF id/folder."""
    algorithm: str | None = None
    """grpo, rloo, dpo, ppo (gigpo: see --estimator)."""
    estimator: str | None = None
    """Advantage estimator, e.g. gigpo (with grpo)."""
    priority: Literal["urgent", "high", "normal", "low"] | None = None
    """The job's place in the queue."""
    sample_size: int | None = Field(None, ge=1)
    """Trajectories to sample."""
    min_reward: float | None = None
    """Dataset filter: minimum total reward."""
    env: str | None = None
    """Train online in this environment instead."""
    iterations: int = Field(10, ge=1)
    """Environment jobs: iterations."""
    idempotency_key: str | None = None
    """Start at most once per key (API)."""
    follow: bool = False
    """Show progress until it ends."""


class StatusOptions(Connection):
    """`agentrl train status`."""

    follow: bool = False
    """Progress until it ends."""


class ListOptions(Connection):
    """`agentrl train list`."""

    status: str | None = None
    """Only jobs with this status."""


class ServeOptions(BaseModel):
    """`agentrl train serve`."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    nats: str | None = None
    """NATS URL (default: settings)."""


class TrainingBench(BaseModel):
    """Dataset loading rate, request->running and cancel latencies, job overhead."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    trajectories: int = Field(100_000, ge=1)
    """Trajectories for the loading figure."""
    jobs: int = Field(5, ge=1)
    """Jobs for the control-path latencies."""
    job_seconds: float = Field(300.0, gt=0)
    """Length of the overhead job (seconds)."""

    @classmethod
    def quick(cls, **kw: Any) -> TrainingBench:
        """Small sizes (a smoke run, not a figure)."""
        return cls(**{"trajectories": 5_000, "jobs": 2, "job_seconds": 20.0, **kw})
