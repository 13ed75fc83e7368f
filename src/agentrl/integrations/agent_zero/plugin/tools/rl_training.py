"""agentrl: the RL Trainer's tool. Start a training job or read a job's status through
agentrl's control API (POST /training/start, GET /training/{job_id}/status).

Use: {"tool_name": "rl_training:start", "tool_args": {"algorithm": "grpo", ...}}
     {"tool_name": "rl_training:status", "tool_args": {"job_id": "..."}}
"""

try:
    from helpers.tool import Response, Tool  # Agent Zero, plugin layout (2026)
except ImportError:  # older checkouts and forks
    from python.helpers.tool import Response, Tool  # type: ignore[no-redef]

try:
    from agentrl.integrations.agent_zero import hooks
    from agentrl.integrations.agent_zero.training_tool import run_training_tool
except Exception as exc:  # agentrl's client is not installed where Agent Zero runs
    hooks = None  # type: ignore[assignment]
    _missing = f"agentrl's client is not installed in Agent Zero's Python ({exc})"


class RLTraining(Tool):
    async def execute(self, **kwargs):
        if hooks is None:
            return Response(message=f"rl_training unavailable: {_missing}", break_loop=False)
        config = hooks.config_for(__file__)
        text = await run_training_tool(config, self.method, dict(kwargs))
        return Response(message=text, break_loop=False)
