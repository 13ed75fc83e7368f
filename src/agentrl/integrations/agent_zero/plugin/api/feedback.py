"""agentrl: POST /plugins/agentrl/feedback {context, log_no, kind: thumbs_up|thumbs_down,
comment?, correction?}: a thumb on a message of the web UI, sent as agent.rl.feedback.v1 for the
trajectory of the monologue that wrote it (spooled while NATS is away).

Part of the agentrl plugin for Agent Zero; the logic is in agentrl's client
(agentrl.integrations.agent_zero.feedback). Without the client it answers 503.
"""

try:
    from helpers.api import ApiHandler, Request, Response  # Agent Zero, plugin layout (2026)
except ImportError:  # older checkouts and forks
    from python.helpers.api import ApiHandler, Request, Response  # type: ignore[no-redef]

try:
    from agentrl.integrations.agent_zero import feedback as rl_feedback
except Exception as exc:  # agentrl's client is not installed where Agent Zero runs
    rl_feedback = None  # type: ignore[assignment]
    _missing = f"agentrl's client is not installed in Agent Zero's Python ({exc})"


class Feedback(ApiHandler):
    async def process(self, input: dict, request: Request) -> dict | Response:
        if rl_feedback is None:
            return Response(_missing, 503)
        from agent import AgentContext

        context = AgentContext.get(str(input.get("context", "")))
        if context is None:
            return Response("Context not found", 404)
        return await rl_feedback.feedback_from_ui(
            context,
            input.get("kind"),
            input.get("log_no"),
            input.get("comment"),
            __file__,
            correction=input.get("correction"),
        )
