"""`agent.rl.model.deployed.v1`: a validated model was rolled out (seed 000, section 5).

`deployment_config.serving_platform` names the serving engine where it is one of the
published schema's values (tensorzero, vllm, tgi, ollama); agentrl's own gateway with its
embedded Hugging Face backend has no value there and goes out as `agentrl-gateway` (the one
documented deviation from PMOVES.AI's schema).

`HoldRequest`/`HoldReply` on `hold_subject(public)`: a request to the deploy service (core
NATS, no stream) to serve a version no split routes, by its id, for a while.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from agentrl.contracts.base import (
    Event,
    Finite,
    Id,
    Part,
    Percent,
    Timestamp,
    new_id,
    noop_when_valid,
)


class ModelInfo(Part):
    model_id: Id
    base_model: str
    checkpoint_path: str
    training_date: Timestamp | None = None
    training_samples: int | None = Field(None, ge=1, description=">= 1, or absent.")
    final_reward: Finite | None = None

    @model_validator(mode="before")
    @classmethod
    @noop_when_valid  # 0 fails `ge=1`
    def _zero_is_unknown(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("training_samples") == 0:
            data = {k: v for k, v in data.items() if k != "training_samples"}
        return data


class RampStep(Part):
    timestamp: Timestamp
    percentage: Percent


SERVING_PLATFORMS = ("tensorzero", "vllm", "tgi", "ollama")


class DeploymentConfig(Part):
    serving_platform: str = Field(
        "agentrl-gateway", description=f"One of {SERVING_PLATFORMS}, or agentrl-gateway."
    )
    endpoint: str
    model_name: str
    rollout_strategy: Literal["canary", "blue_green", "immediate"] = "canary"
    traffic_percentage: Percent = 10.0
    ramp_schedule: list[RampStep] = Field(default_factory=list)


class ValidationResults(Part):
    benchmark_passed: bool
    safety_checks_passed: bool
    performance_regression: bool
    human_eval_score: Finite | None = None


class DeploymentMetadata(Part):
    deployed_by: str | None = None
    approval_status: Literal["automated", "manual_approved", "emergency_override"] = "automated"
    previous_model: str | None = None


class ModelDeployed(Event):
    SUBJECT: ClassVar[str] = "agent.rl.model.deployed.v1"
    ID_FIELD: ClassVar[str | None] = "deployment_id"

    deployment_id: Id = Field(default_factory=new_id)
    training_job_id: Id
    timestamp: Timestamp
    model_info: ModelInfo
    deployment_config: DeploymentConfig
    validation_results: ValidationResults
    metadata: DeploymentMetadata = Field(default_factory=DeploymentMetadata)


# ---- requests to the deploy service (core NATS request/reply: no stream keeps them) --------

HOLD_PREFIX = "agentrl.deploy.hold"
HOLD_MAX_TTL_S = 3600.0


def hold_subject(public_name: str) -> str:
    """Where the deploy service of `public_name` takes holds (one deployment's apart from
    another's on the same NATS); one replica of it answers (a queue group)."""
    return f"{HOLD_PREFIX}.{re.sub(r'[^A-Za-z0-9_-]', '_', public_name)}"


class HoldRequest(Part):
    """Load a version no split routes into every gateway process of the deployment, routable
    by its own id only (no share of any public name's traffic), for `ttl_s` seconds: renewed
    by asking again, released by `ttl_s` 0 or by its expiry (a caller that dies mid-way
    leaves nothing loaded for longer than one TTL)."""

    model_id: Id
    ttl_s: float = Field(ge=0.0, le=HOLD_MAX_TTL_S, allow_inf_nan=False)


class HoldReply(Part):
    """`ok`: every gateway that reported serves it (or, for a release, the hold is gone);
    else `why` it cannot be."""

    ok: bool
    why: str | None = None
    model_id: str | None = None
    until: float | None = None  # the hold's end, epoch seconds of the answering replica
    gateways: list[str] = Field(default_factory=list)  # the gateways that serve it
