"""agentrl: a tool starts: its name, arguments and start time.

Part of the agentrl plugin for Agent Zero; the logic is in the installed agentrl package
(agentrl.integrations.agent_zero.hooks), which never raises into Agent Zero's loop.
"""

try:
    from helpers.extension import Extension  # Agent Zero, plugin layout (2026)
except ImportError:  # older checkouts and forks: python/extensions/<point>/
    from python.helpers.extension import Extension  # type: ignore[no-redef]

from agentrl.integrations.agent_zero import hooks


class AgentRLToolExecuteBefore(Extension):
    async def execute(self, tool_args=None, tool_name="", **kwargs):
        await hooks.tool_execute_before(self.agent, tool_name, tool_args, __file__)
