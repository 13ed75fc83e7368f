"""Deployment errors: each message says what went wrong and what to do."""

from __future__ import annotations

from agentrl.core.errors import AgentRLError


class DeployError(AgentRLError):
    """A deployment action was refused or failed (bad ramp, no previous version, ...)."""


class ChecksumError(DeployError):
    """A checkpoint's files do not match the sha256 recorded in the registry."""


class BackendError(DeployError):
    """A serving backend failed (502) or timed out (504)."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


class UnknownModel(DeployError):
    """An action named a model id the registry does not know (the API answers 404)."""


class VersionNotServed(DeployError):
    """A request named a version the backend does not serve now: never loaded, unloaded
    meanwhile, or a retired lineage's (404; serving the base under its name instead would
    label the base's answer as that version)."""

    status = 404
    code = "model_not_found"
