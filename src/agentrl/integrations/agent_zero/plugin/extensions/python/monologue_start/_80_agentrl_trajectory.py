"""agentrl: a monologue starts: begin a trajectory (and flush what is spooled).

Part of the agentrl plugin for Agent Zero; the logic is in the installed agentrl package
(agentrl.integrations.agent_zero.hooks), which never raises into Agent Zero's loop.
"""

try:
    from helpers.extension import Extension  # Agent Zero, plugin layout (2026)
except ImportError:  # older checkouts and forks: python/extensions/<point>/
    from python.helpers.extension import Extension  # type: ignore[no-redef]

from agentrl.integrations.agent_zero import hooks


class AgentRLMonologueStart(Extension):
    async def execute(self, loop_data=None, **kwargs):
        await hooks.monologue_start(self.agent, loop_data, __file__)
