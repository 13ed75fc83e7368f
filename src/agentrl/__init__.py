"""agentrl: reinforcement learning from their own work for LLM agents."""

from agentrl.core.aiohttp_on_use import defer as _defer_aiohttp

__version__ = "0.1.0"

# nats-py's WebSocket transport imports aiohttp at its first use, not at every start
_defer_aiohttp()
