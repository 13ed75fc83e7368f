"""agentrl: the main chat call is about to start: tag it, to learn the serving version.

Part of the agentrl plugin for Agent Zero; the logic is in the installed agentrl package
(agentrl.integrations.agent_zero.hooks), which never raises into Agent Zero's loop.
"""

try:
    from helpers.extension import Extension  # Agent Zero, plugin layout (2026)
except ImportError:  # older checkouts and forks: python/extensions/<point>/
    from python.helpers.extension import Extension  # type: ignore[no-redef]

from agentrl.integrations.agent_zero import hooks


class AgentRLChatModelCallBefore(Extension):
    async def execute(self, call_data=None, **kwargs):
        await hooks.chat_model_call_before(self.agent, call_data, __file__)
