"""agentrl: a tool answered (masked by _10_mask_secrets): its result and duration.

Part of the agentrl plugin for Agent Zero; the logic is in agentrl's client
(agentrl.integrations.agent_zero.hooks), which never raises into Agent Zero's loop. Without
the client in Agent Zero's Python this file logs once and does nothing: a chat never breaks.
"""

try:
    from helpers.extension import Extension  # Agent Zero, plugin layout (2026)
except ImportError:  # older checkouts and forks: python/extensions/<point>/
    from python.helpers.extension import Extension  # type: ignore[no-redef]

try:
    from agentrl.integrations.agent_zero import hooks
except Exception as exc:  # agentrl's client is not installed where Agent Zero runs
    import logging

    _log = logging.getLogger("agentrl.agent_zero")
    if not getattr(_log, "agentrl_missing", False):
        _log.__dict__["agentrl_missing"] = True
        _log.warning("agentrl plugin inactive (%s): run `agentrl agent-zero install`", exc)
    hooks = None  # type: ignore[assignment]


class AgentRLToolExecuteAfter(Extension):
    async def execute(self, response=None, tool_name="", **kwargs):
        if hooks is not None:
            await hooks.tool_execute_after(self.agent, tool_name, response, __file__)
