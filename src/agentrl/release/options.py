"""The settings of `agentrl deploy ...` and `agentrl lineage ...`: the commands draw their
options (and positional arguments) from these models' fields and docstrings
(`agentrl.core.configcli`); `--set FIELD=VALUE` reaches the rest. Each action keeps the
reason it has always written in the audit trail when none is given."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

WHY = "Why (kept in the audit trail)."


class Connection(BaseModel):
    """Where the registry is: the NATS server (its KV bucket AGENTRL_DEPLOY_BUCKET)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    nats_url: str | None = None
    """NATS server (default: NATS_URL)."""


class ModelRef(Connection):
    """`agentrl deploy show MODEL_ID`."""

    model_id: str
    """The version's model id."""


class Decision(Connection):
    """A human's action on the rollout: who and why go into the audit trail."""

    reason: str = Field("manual action", description=WHY)
    by: str = "cli"
    """Who decides (kept in the audit trail)."""


class Promote(Decision):
    """`agentrl deploy promote [MODEL_ID]`."""

    model_id: str | None = None
    """The version to promote (default: the running canary)."""
    reason: str = Field("manual promote", description=WHY)


class Rollback(Decision):
    reason: str = Field("manual rollback", description=WHY)


class Pause(Decision):
    reason: str = Field("paused by a human", description=WHY)


class Resume(Decision):
    reason: str = Field("resumed by a human", description=WHY)


class Weight(Decision):
    """`agentrl deploy weight PERCENT`."""

    percent: float = Field(ge=0.0, le=100.0)
    """The canary's share of the traffic, 0 to 100 (100 promotes)."""
    reason: str = Field("manual ramp", description=WHY)


class TensorZero(Connection):
    function: str = "agent"
    """TensorZero's function name (functions.FUNCTION.experimentation)."""


class LineageRef(Connection):
    """A lineage acted on by name; the actions record `by` as cli."""

    name: str
    """The lineage's name (e.g. agent0/dev)."""
    reason: str = Field("changed by cli", description=WHY)


class LineagePause(LineageRef):
    reason: str = Field("pause by cli", description=WHY)


class LineageResume(LineageRef):
    reason: str = Field("resume by cli", description=WHY)


class LineageRetire(LineageRef):
    reason: str = Field("retire by cli", description=WHY)


class LineageRollback(LineageRef):
    reason: str = Field("manual rollback", description=WHY)


class LineagePromote(LineageRef):
    model_id: str | None = None
    """One of its versions (default: its running canary)."""
    reason: str = Field("manual promote", description=WHY)


class LineageMap(LineageRef):
    """`agentrl lineage map NAME --agent A --profile P`."""

    agent: list[str] = []
    """An agent id routed to it."""
    profile: list[str] = []
    """An Agent Zero profile routed to it."""
    reason: str = Field("mapped by cli", description=WHY)


class LineageCreate(LineageMap):
    """`agentrl lineage create NAME`."""

    parent: str | None = None
    """Start from this lineage's live version (default: the base model)."""
    validation: str | None = None
    """JSON of its own validation settings, e.g. '{"benchmark_seed": 7}'."""
    reason: str = Field("created by cli", description=WHY)

    @field_validator("validation")
    @classmethod
    def _an_object(cls, text: str | None) -> str | None:
        if text is not None and not isinstance(json.loads(text), dict):
            raise ValueError("validation settings are a JSON object")
        return text

    def validation_settings(self) -> dict[str, Any]:
        return dict(json.loads(self.validation)) if self.validation else {}
