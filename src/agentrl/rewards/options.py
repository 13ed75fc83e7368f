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
    """PII redaction: precision and recall on the labelled corpus (agentrl.rewards.pii_corpus,
    207 hand-written strings, about half of them near-misses), and the cost of redacting at the
    edge (`redact_event`, what producers call before publishing) per trajectory in µs."""

    n: int = Field(2000, ge=1)
    """Sample trajectories timed through redact_event."""


class RewardsBench(_Options):
    """End to end through the running reward service: trajectories in, rewards out.

    Publishes trajectories to the embedded NATS and counts the rewards that come back.
    Targets on 2 cores: >= 5,000 trajectories/s without code, >= 200/s with code (ruff +
    bandit), lost 0, duplicates 0. The peer is a raw nats-py service that answers every
    trajectory with a fixed reward.

    With --replicas N: one service against N replicas sharing the durable, on this
    machine, side by side. On one small machine the replicas share its cores, so the
    ratio shows the cost of coordinating them, not scale-out."""

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
