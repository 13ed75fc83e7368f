"""The settings of `agentrl up` and `agentrl report` (`agentrl loop`'s are `LoopConfig`'s):
the commands draw their options from these models' fields and docstrings
(`agentrl.core.configcli`). An option not given leaves the field unset; nothing means
"the default" by a 0."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Options(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


class UpOptions(_Options):
    """`agentrl up`: the embedded stack on this machine."""

    data_dir: Path | None = None
    """Data dir (default: AGENTRL_DATA_DIR, else ./.agentrl)."""
    port: int | None = Field(None, ge=1, le=65535)
    """NATS port (default: a free one)."""
    services: bool = True
    """The services (rewards, warehouse, training, deploy, API) beside NATS and its streams."""
    cluster: int | None = Field(None, ge=1)
    """A JetStream cluster of this many nats-servers on loopback (e.g. 3), streams replicated
    min(3, N) times, instead of one server."""
    replicas: int = Field(1, ge=1)
    """Run this many of every service on this machine (replica i: its own processes,
    AGENTRL_REPLICA_ID=replica-i, API and gateway at the base port + i)."""
    gateway_workers: int | None = Field(None, ge=1)
    """Gateway processes sharing the gateway's port (SO_REUSEPORT; needs
    AGENTRL_CAPTURE_ENABLED=false; default: AGENTRL_DEPLOY_GATEWAY_WORKERS, else 1)."""
    gateway_front: Literal["python", "rust"] | None = None
    """What serves the gateway's port: python (the gateway) or rust (the compiled front,
    gateway-front/, built by scripts/build-gateway-front.sh; needs an upstream or vllm backend
    and AGENTRL_CAPTURE_ENABLED=false; default: AGENTRL_DEPLOY_GATEWAY_FRONT, else python)."""


class ReportOptions(_Options):
    """`agentrl report --out DIR`."""

    out: Path
    """Directory for index.html and the PNG plots."""
    source: Literal["auto", "warehouse", "streams"] = "auto"
    """Where the data comes from: auto (warehouse, else streams), warehouse, streams."""
    nats_url: str | None = None
    """NATS server for --source streams (default: NATS_URL)."""
    hours: float = Field(24 * 7, gt=0)
    """How far back to read."""
