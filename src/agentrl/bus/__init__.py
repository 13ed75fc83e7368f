"""The event bus: a JetStream client and the embedded nats-server."""

from agentrl.bus.client import (
    Bus,
    ConsumeStats,
    Deferred,
    Delivery,
    PermanentError,
    TransientError,
    current_delivery,
)
from agentrl.bus.server import EmbeddedNats, NatsCluster

__all__ = [
    "Bus",
    "ConsumeStats",
    "Deferred",
    "Delivery",
    "EmbeddedNats",
    "NatsCluster",
    "PermanentError",
    "TransientError",
    "current_delivery",
]
