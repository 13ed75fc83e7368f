"""The settings of one `agentrl soak` (its options are drawn from this model's fields and
docstrings: `agentrl.core.configcli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class SoakConfig(BaseModel):
    """Run the loop on a stack whose services are separate processes (tiny model, loopback
    only) and kill, once each, the reward service, the warehouse ingester, a running
    training job's process and nats-server (SIGKILL), restarting each. Then check that
    every trajectory has exactly one reward per version, the warehouse matches the
    streams, no job is stuck and every gateway error was counted. Prints the recovery
    times and checks; the last line is one JSON object; exit code 1 if a check failed.
    The defaults fit a few minutes on 2 shared cores."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    data_dir: Path = Path(".agentrl/soak")
    """A fresh (empty or missing) folder for this soak's stack."""
    model: str = "tiny"
    """Base model of the stack's services."""
    agents: int = Field(2, ge=1)
    """Agent workers acting through the gateway."""
    group_size: int = 4
    """Episodes per group."""
    max_steps: int = 4
    """Turns per episode."""
    threshold: int = Field(16, ge=1)
    """Rewarded trajectories per training job."""
    restart_delay_s: float = 1.0
    """Seconds between a kill and the restart. A supervisor's backoff."""
    recover_timeout_s: float = 120.0
    """A component not back after this long has not recovered."""
    job_wait_s: float = 240.0
    """How long to wait for a training job."""
    drain_timeout_s: float = 180.0
    """How long to wait for the streams to drain at the end."""
    settle_s: float = 10.0
    """Seconds to let the stack settle after a restart."""
    burst: int = 300
    """Trajectories of the burst phase."""
    release_kills: bool = True
    """Phase 6: the controller killed mid-rollback and mid-promote."""
    api_port_taken: bool = True
    """Phase 0: the control API's port taken at start."""
    nats_down_s: float = 60.0
    """Phase 4b: nats-server away this long while a job ends."""
    replicas: int = Field(1, ge=1)
    """Run this many of every service and kill one of each kind. The replicated soak
    (`agentrl.bench.soak_replicas`): each replica its own processes."""
    cluster: int | None = Field(None, ge=2)
    """With --replicas: a NATS cluster of this many nodes, whose leader is killed (unset:
    one server)."""
    lease_ttl_s: float = 10.0
    """Training job and controller leases in the replicated soak. Longer than a NATS leader
    election (about 5 s here), else a node kill looks like a dead runner."""

    @classmethod
    def quick(cls, **kw: Any) -> SoakConfig:
        """With --replicas: shorter waits, a smaller threshold."""
        if int(kw.get("replicas", 1)) <= 1:
            return cls(**kw)
        short = {"agents": 1, "threshold": 8, "settle_s": 3.0}
        return cls(**{**short, "job_wait_s": 180.0, "drain_timeout_s": 120.0, **kw})

    @property
    def nats_nodes(self) -> int:
        """nats-servers of the replicated soak: the cluster's, else one."""
        return self.cluster or 1
