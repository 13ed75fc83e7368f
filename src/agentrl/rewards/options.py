"""The settings of the reward commands: `agentrl rewards serve|score` and `agentrl bench
rewards|redaction` draw their options from these models' fields and docstrings
(`agentrl.core.configcli`); `--set FIELD=VALUE` reaches the fields without an option."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Options(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


class ServeOptions(_Options):
    """One reward service process (`RewardService`)."""

    nats_url: str | None = None
    """NATS server (default: NATS_URL / AGENTRL_NATS_URL)."""
    data_dir: Path | None = None
    """Where the service keeps its state (default: AGENTRL_DATA_DIR)."""
    config: Path | None = None
    """Reward config YAML: weights, window, total_reward raw|normalized, custom functions,
    opt-outs. Default: AGENTRL_REWARDS_CONFIG, else <data dir>/rewards.yaml when it exists,
    as `agentrl up`."""
    durable: str = Field("rewards", min_length=1)
    """Durable consumer name. Services with one name are replicas of one service."""
    batch: int = Field(256, ge=1)
    """Trajectories fetched and scored per batch."""
    ack_wait: float = Field(30.0, gt=0)
    """Seconds before the server redelivers what a crashed service had not acked."""
    max_deliver: int = Field(5, ge=1)
    """Deliveries of one trajectory before it is dead-lettered."""
    max_inflight: int = Field(4, ge=1)
    """Batches scored at once."""


class ScoreOptions(_Options):
    """`agentrl rewards score`: offline scoring, no bus."""

    config: Path | None = None
    """Reward config YAML (default: the built-in weights)."""
    demo: int | None = Field(None, ge=1)
    """Score N generated sample trajectories instead of a file."""


class RedactionBench(_Options):
    """`agentrl bench redaction`."""

    n: int = Field(2000, ge=1)
    """Sample trajectories timed through redact_event."""


class RewardsBench(_Options):
    """`agentrl bench rewards`: the full size; `quick()` the short one."""

    n: int = Field(50_000, ge=1)
    """Trajectories without code."""
    n_code: int = Field(5_000, ge=1)
    """Trajectories with code (ruff + bandit)."""
    url: str | None = None
    """Use an existing NATS server (its trajectory and reward streams are purged)."""
    replicas: int = Field(1, ge=1)
    """Compare one service with this many replicas on one durable (1, N, N, 1). Instead of
    the usual phases."""
    paced_s: float = Field(4.0, gt=0)
    """Seconds of the paced (latency) part of each phase."""

    @classmethod
    def quick(cls, **kw: Any) -> RewardsBench:
        """10,000 + 1,000 trajectories instead of 50,000 + 5,000."""
        return cls(**{"n": 10_000, "n_code": 1_000, "paced_s": 2.0, **kw})
