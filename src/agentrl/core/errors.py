"""One small error hierarchy: every message says what went wrong and what to do."""

from __future__ import annotations


class AgentRLError(Exception):
    """Base of every error agentrl raises on purpose."""


class ConfigError(AgentRLError, ValueError):
    """A setting or configuration value is missing or out of range."""


class ContractError(AgentRLError, ValueError):
    """A payload does not match its event contract."""


class BusError(AgentRLError):
    """The event bus could not do what was asked (publish, consume, connect)."""


class PayloadTooLargeError(BusError):
    """A message is larger than the server's max_payload."""


class ServerError(AgentRLError):
    """The embedded nats-server could not be started or reached."""


class TrainingError(AgentRLError):
    """A training job failed; `code` maps to the status contract's error codes."""

    def __init__(self, message: str, code: str = "INFRA") -> None:
        super().__init__(message)
        self.code = code
