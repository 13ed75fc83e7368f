"""Issue 30.1: the plugin's `structured_outputs` setting (off by default). On, Agent Zero's
main chat call asks agentrl's gateway for Agent Zero's response schema through the kwargs
its LiteLLM wrapper passes on (`response_format`), `tool_name` narrowed to the agent's own
tools (the `tools/*.py` of the folders `get_tool` searches); the gateway enforces it token
by token and the answer validates. Off, no response_format is sent. Real LiteLLM streaming
(closed at the first complete JSON, as Agent Zero does), a real gateway over a tiny model,
a real nats-server."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from a0_kit import Checkout, stream_payloads, trajectories_of
from test_agent_zero_gateway import LiteLLMChatModel, serve

from agentrl.bus import Bus
from agentrl.integrations.agent_zero import structured
from agentrl.serving.backends import LocalBackend
from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app
from agentrl.serving.openai_types import ChatRequest
from agentrl.serving.structured import constraint_for

# litellm is imported where it is called (test_agent_zero_gateway): ~4 s of CPU otherwise
# paid by every pytest process collecting this module
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("litellm") is None, reason="litellm (Agent Zero's client)"
)

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}
TOOLS = {"code_execution_tool", "response", "rl_training"}  # rl_training: the plugin's own
ONE_TURN = {
    "context_id": "a0-ctx-structured",
    "agent": {"number": 0, "profile": "agent0"},
    "user_message": {"id": "msg-s1", "content": {"user_message": "Say hello."}},
    "iterations": [{"response": "", "tool": {"message": "hello", "break_loop": True}}],
}


class RecordingChatModel(LiteLLMChatModel):
    """Agent Zero's LiteLLM chat wrapper (greedy, so the tiny model's answer is short)."""

    def __init__(self, iteration: dict[str, Any], api_base: str, max_tokens: int) -> None:
        super().__init__(iteration, api_base)
        self.kwargs.update(temperature=0, max_tokens=max_tokens)
        self.kwargs_seen: dict[str, Any] = {}
        self.text = ""

    async def unified_call(self, messages: Any = None, **kwargs: Any) -> tuple[str, str]:
        self.kwargs_seen = kwargs
        self.text, reasoning = await super().unified_call(messages, **kwargs)
        return self.text, reasoning


@pytest.fixture(scope="module")
def engine() -> Any:
    from agentrl.serving.local import LocalEngine

    return LocalEngine("tiny", seed=0, tiny_kwargs=TINY, default_max_tokens=16)


@pytest.fixture()
async def gateway(engine: Any, a0_nats: Any, tmp_path: Path):
    bus = await Bus.connect(a0_nats.url)
    await bus.ensure_streams()
    log = CompletionLog(bus)
    stop = asyncio.Event()
    log_task = asyncio.create_task(log.run(stop))
    state = GatewayState("agentrl-policy", completion_log=log, timeout_s=120.0)
    state.backends["agentrl-policy-v1"] = LocalBackend(engine, tmp_path)
    state.set_split({"agentrl-policy-v1": 100.0}, ["agentrl-policy-v1"])
    server, task, port = await serve(create_gateway_app(state))
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await task
        stop.set()
        await log_task
        await bus.close()


async def one_turn(
    checkout: Checkout, gateway: str, max_tokens: int, **config: Any
) -> tuple[Any, Any]:
    (checkout.root / "tools").mkdir()
    for name in ("response", "code_execution_tool", "unknown"):  # Agent Zero's tools/
        (checkout.root / "tools" / f"{name}.py").write_text("")
    checkout.write_config(gateway_url=gateway, **config)
    models: list[RecordingChatModel] = []

    def factory(iteration: dict[str, Any], api_base: str) -> RecordingChatModel:
        models.append(RecordingChatModel(iteration, gateway, max_tokens))
        return models[-1]

    checkout.driver.model_factory = factory
    agent, _ = await checkout.run(ONE_TURN)
    (model,) = models
    return agent, model


async def test_structured_outputs_ask_for_agent_zeros_schema_and_the_answer_fits(
    checkout: Checkout, gateway: str, a0_nats: Any
) -> None:
    import jsonschema  # here, not at the top: ~2 s of CPU in every collecting process

    agent, model = await one_turn(checkout, gateway, 300, structured_outputs=True)
    fmt = model.kwargs_seen["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "agent_zero_response"
    schema = fmt["json_schema"]["schema"]
    assert schema == structured.response_schema(sorted(TOOLS))
    assert set(schema["properties"]["tool_name"]["anyOf"][0]["enum"]) == TOOLS
    # the gateway enforced it: what Agent Zero read is one well-formed tool request
    answer = json.loads(model.text[: model.text.rindex("}") + 1])
    jsonschema.validate(answer, schema)
    assert answer["tool_name"].split(":")[0] in TOOLS
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    (turn,) = payload["turns"]
    assert turn["action"]["tool_name"] == answer["tool_name"]
    rows = [
        r
        for r in await stream_payloads(a0_nats.url, "agent.rl.completion.v1")
        if r["completion_id"] == turn["action"]["completion_id"]
    ]
    # decoded under exactly that schema: the gateway's hash of the constraint it compiled
    asked = ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": fmt}
    )
    constraint = constraint_for(asked)
    assert constraint is not None
    assert len(rows) == 1 and rows[0]["constrained"] is True
    assert rows[0]["schema_hash"] == constraint.key


async def test_structured_outputs_off_by_default_send_no_response_format(
    checkout: Checkout, gateway: str
) -> None:
    _, model = await one_turn(checkout, gateway, 8)
    assert model.kwargs_seen.get("extra_headers")  # the turn was tagged for agentrl's gateway
    assert "response_format" not in model.kwargs_seen


def test_tool_names_stay_free_when_they_cannot_be_known() -> None:
    import jsonschema

    class NoTools:  # outside Agent Zero (no helpers.subagents): nothing is forbidden
        config = None

    assert structured.tool_names_of(NoTools()) is None
    schema = structured.response_schema(None)
    jsonschema.validate(
        {"thoughts": ["t"], "headline": "h", "tool_name": "mcp_server.any_tool", "tool_args": {}},
        schema,
    )
    narrowed = structured.response_schema(["response", "rl_training"])
    for ok in ("response", "rl_training:start"):
        jsonschema.validate({**_answer(), "tool_name": ok}, narrowed)
    for bad in ("responses", "memory_load", "response:"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**_answer(), "tool_name": bad}, narrowed)


def _answer() -> dict[str, Any]:
    return {"thoughts": ["t"], "headline": "h", "tool_args": {}}


async def test_every_turn_records_its_token_usage_from_the_completion_log(
    checkout: Checkout, gateway: str, a0_nats: Any
) -> None:
    """Issue 51.4: Agent Zero closes the stream at the first complete JSON tool request, so
    the usage chunk never comes and LiteLLM reports nothing; the turn's prompt and completion
    tokens come from the gateway's completion log, by the turn's completion id."""
    agent, model = await one_turn(checkout, gateway, 300, structured_outputs=True)
    assert model.closed_early  # the normal turn: no usage chunk was read
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    (turn,) = payload["turns"]
    (row,) = [
        r
        for r in await stream_payloads(a0_nats.url, "agent.rl.completion.v1")
        if r["completion_id"] == turn["action"]["completion_id"]
    ]
    prompt, done = len(row["prompt_token_ids"]), len(row.get("completion_token_ids", []))
    assert prompt > 0
    assert turn["action"]["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": done,
        "total_tokens": prompt + done,
    }
    assert payload["metadata"]["total_tokens"] == prompt + done
    assert payload["metadata"]["usage"] == turn["action"]["usage"]
