"""The settings of `agentrl agent-zero install|flush|feedback|listen`: the commands draw their
options from these models' fields and docstrings (`agentrl.core.configcli`); `--set FIELD=VALUE`
reaches the fields without an option."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Options(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


class InstallOptions(_Options):
    """`agentrl agent-zero install PATH`: where agentrl runs, saved in the plugin's config."""

    layout: Literal["auto", "plugin", "legacy"] = "auto"
    """plugin (usr/plugins/agentrl), legacy (python/extensions/) or auto."""
    python: str | None = None
    """Agent Zero's Python (default: /opt/venv-a0/bin/python, PATH/.venv, PATH/venv)."""
    client: bool = True
    """Install agentrl's client (agentrl-a0-client) into Agent Zero's Python."""
    nats_url: str | None = None
    """agentrl's NATS (`agentrl up` prints it; default: NATS_URL)."""
    gateway_url: str | None = None
    """agentrl's gateway, .../v1 (default: AGENTRL_GATEWAY_PORT on loopback)."""
    api_url: str | None = None
    """agentrl's control API (default: AGENTRL_API_PORT)."""
    nats_token: str | None = None
    """NATS token, if it asks."""
    api_token: str | None = None
    """A control API token."""

    def urls(self) -> dict[str, str]:
        """The connection settings given (the plugin's config keeps the others)."""
        keys = {"nats_url", "gateway_url", "api_url", "nats_token", "api_token"}
        return {k: v for k, v in self.model_dump(include=keys).items() if v is not None}


class FlushOptions(_Options):
    """`agentrl agent-zero flush PATH`."""

    timeout: float = Field(30.0, gt=0)
    """Seconds to keep trying."""


class FeedbackOptions(_Options):
    """`agentrl agent-zero feedback PATH TRAJECTORY KIND`."""

    rating: int | None = Field(None, ge=1, le=5)
    """A rating from 1 to 5 (kind rating)."""
    comment: str | None = None
    """A comment of the user's."""
    correction: str | None = None
    """The answer the agent should have given."""


class ListenOptions(_Options):
    """`agentrl agent-zero listen PATH`."""

    durable: str = Field("agent-zero-deployments", min_length=1)
    """Durable consumer name."""
