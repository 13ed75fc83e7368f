"""Agent frameworks, unchanged, feed the loop: each runs a small tool-using agent against the
gateway (tiny model); the episode must come out as a trajectory with the right turns, tool
calls, results and serving version, and feedback on it must give reward version 2 through
the real reward service. The frameworks are the `[frameworks]` test extra; a test skips
(saying so) only where its framework is not installed.

The tiny random model is steered to each answer with vLLM's `guided_choice` (served by the
gateway, token-exact); where a framework fixes its request body for a whole run, its own
per-step hook changes the steering (openai-agents' RunHooks, smolagents' step callbacks).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from typing import Any

import pytest
from capture_kit import VERSION, Harness
from toolkit import CALL, FINAL, SYSTEM, TASK, TOOLS, add, assert_tool_episode, steer


async def feedback_gives_version_2(h: Harness, session: str, tid: str) -> None:
    await h.reward_versions(tid, 1)
    r = await h.feedback(episode_id=session, metric_name="task_success", value=True)
    assert r.status_code == 202, r.text
    got = await h.reward_versions(tid, 2)
    assert [d["metadata"]["version"] for d in got] == [1, 2]
    assert got[1]["reward_components"]["user_feedback"]["score"] == 1.0


async def test_openai_agents_sdk(harness: Harness) -> None:
    agents = pytest.importorskip("agents", reason="openai-agents: the [frameworks] extra")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # its tracer would upload to api.openai.com
    session = f"oa-agents-{uuid.uuid4().hex[:8]}"

    @agents.function_tool
    def add_numbers(a: float, b: float) -> str:
        """Add two numbers."""
        return add(a, b)

    class Steer(agents.RunHooks):  # type: ignore[misc]
        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: str) -> None:
            agent.model_settings = agent.model_settings.resolve(
                agents.ModelSettings(extra_body=steer(FINAL))
            )

    client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
    agent = agents.Agent(
        name="calc",
        instructions=SYSTEM,
        tools=[add_numbers],
        model=agents.OpenAIChatCompletionsModel(model="agentrl-policy", openai_client=client),
        model_settings=agents.ModelSettings(
            extra_headers={"x-agentrl-session": session},
            extra_body=steer(CALL.replace('"add"', '"add_numbers"')),
        ),
    )
    result = await agents.Runner.run(agent, TASK, hooks=Steer(), max_turns=4)
    assert result.final_output == FINAL
    ended = await harness.end(session, success=True)
    traj = await harness.trajectory(ended["trajectory_id"])
    turns = traj["turns"]
    assert [t["action"]["type"] for t in turns] == ["tool_call", "response"]
    assert turns[0]["action"]["tool_name"] == "add_numbers"
    assert turns[0]["action"]["tool_args"] == {"a": 2, "b": 3}
    assert turns[0]["result"]["output"] == "5" and turns[1]["observation"]["content"] == "5"
    assert turns[1]["action"]["raw_response"] == FINAL
    assert traj["task_context"]["instructions"] == TASK
    assert traj["metadata"]["model"] == VERSION
    await feedback_gives_version_2(harness, session, traj["trajectory_id"])
    await client.close()


async def test_pydantic_ai_agent_with_a_tool(harness: Harness) -> None:
    pytest.importorskip("pydantic_ai", reason="pydantic-ai-slim: the [frameworks] extra")
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    session = f"pydantic-ai-{uuid.uuid4().hex[:8]}"
    client = AsyncOpenAI(base_url=harness.base_url, api_key="unused", max_retries=0)
    model = OpenAIChatModel("agentrl-policy", provider=OpenAIProvider(openai_client=client))
    settings: dict[str, Any] = {
        "extra_headers": {"x-agentrl-session": session},
    }
    agent = Agent(model, system_prompt=SYSTEM, model_settings=settings)  # type: ignore[arg-type]

    @agent.tool_plain
    def add_numbers(a: float, b: float) -> str:
        """Add two numbers."""
        settings["extra_body"] = steer(FINAL)  # the next request: the final answer
        return add(a, b)

    settings["extra_body"] = steer(CALL.replace('"add"', '"add_numbers"'))
    result = await agent.run(TASK)
    assert result.output == FINAL
    ended = await harness.end(session, success=True)
    assert ended["threads"] == 1
    traj = await harness.trajectory(ended["trajectory_id"])
    turns = traj["turns"]
    assert [t["action"]["type"] for t in turns] == ["tool_call", "response"]
    assert turns[0]["action"]["tool_name"] == "add_numbers"
    assert turns[0]["action"]["tool_args"] == {"a": 2, "b": 3}
    assert turns[0]["result"]["output"] == "5" and turns[1]["observation"]["content"] == "5"
    assert turns[1]["action"]["raw_response"] == FINAL
    assert all(t["action"]["completion_id"].startswith("chatcmpl-") for t in turns)
    assert traj["task_context"]["instructions"] == TASK
    assert traj["metadata"]["model"] == VERSION
    await feedback_gives_version_2(harness, session, traj["trajectory_id"])
    await client.close()


async def test_langchain_openai_with_tools(harness: Harness) -> None:
    lc = pytest.importorskip("langchain_openai", reason="langchain-openai: the [frameworks] extra")
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    session = f"langchain-{uuid.uuid4().hex[:8]}"

    @tool
    def add_tool(a: float, b: float) -> str:
        """Add two numbers."""
        return add(a, b)

    add_tool.name = "add"
    llm = lc.ChatOpenAI(
        model="agentrl-policy",
        base_url=harness.base_url,
        api_key="unused",
        default_headers={"x-agentrl-session": session},
        max_retries=0,
    ).bind_tools([add_tool])
    messages: list[Any] = [SystemMessage(SYSTEM), HumanMessage(TASK)]
    for choice in (CALL, FINAL):
        ai = await llm.ainvoke(messages, extra_body=steer(choice))
        messages.append(ai)
        for call in ai.tool_calls:
            messages.append(ToolMessage(add_tool.invoke(call["args"]), tool_call_id=call["id"]))
    assert messages[-1].content == FINAL
    ended = await harness.end(session, success=True)
    traj = await harness.trajectory(ended["trajectory_id"])
    assert_tool_episode(traj, VERSION)
    await feedback_gives_version_2(harness, session, traj["trajectory_id"])


async def test_litellm(harness: Harness) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    litellm = pytest.importorskip("litellm", reason="litellm: the [frameworks] extra")
    session = f"litellm-{uuid.uuid4().hex[:8]}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    for choice in (CALL, FINAL):
        r = await litellm.acompletion(
            model="openai/agentrl-policy",
            api_base=harness.base_url,
            api_key="unused",
            messages=messages,
            tools=TOOLS,
            extra_headers={"x-agentrl-session": session},
            extra_body=steer(choice),
        )
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls or []:
            out = add(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    assert messages[-1]["content"] == FINAL
    ended = await harness.end(session, success=True)
    traj = await harness.trajectory(ended["trajectory_id"])
    assert_tool_episode(traj, VERSION)
    await feedback_gives_version_2(harness, session, traj["trajectory_id"])


async def test_smolagents_tool_calling_agent_with_openinference_export(harness: Harness) -> None:
    smolagents = pytest.importorskip("smolagents", reason="smolagents: the [frameworks] extra")
    instr = pytest.importorskip(
        "openinference.instrumentation.smolagents", reason="the [frameworks] extra"
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    session = f"smol-{uuid.uuid4().hex[:8]}"
    final_call = json.dumps({"name": "final_answer", "arguments": {"answer": FINAL}})

    @smolagents.tool
    def add_numbers(a: float, b: float) -> str:
        """Add two numbers.

        Args:
            a: the first number
            b: the second number
        """
        return add(a, b)

    def steer_next(step: Any, agent: Any) -> None:  # a step callback: after the tool call
        agent.model.kwargs["extra_body"] = steer(final_call)

    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{harness.api}/v1/traces"))
    )
    instrumentor = instr.SmolagentsInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        model = smolagents.OpenAIServerModel(
            model_id="agentrl-policy",
            api_base=harness.base_url,
            api_key="unused",
            client_kwargs={"default_headers": {"x-agentrl-session": session}, "max_retries": 0},
            extra_body=steer(CALL.replace('"add"', '"add_numbers"')),
        )
        agent = smolagents.ToolCallingAgent(
            tools=[add_numbers], model=model, max_steps=3, step_callbacks=[steer_next]
        )
        answer = await asyncio.to_thread(agent.run, TASK)
        await asyncio.to_thread(provider.force_flush)
    finally:
        instrumentor.uninstrument()
        await asyncio.to_thread(provider.shutdown)
    assert answer == FINAL
    # 1) the gateway's episode
    ended = await harness.end(session, success=True)
    traj = await harness.trajectory(ended["trajectory_id"])
    turns = traj["turns"]
    assert [t["action"]["tool_name"] for t in turns] == ["add_numbers", "final_answer"]
    assert turns[0]["action"]["tool_args"] == {"a": 2, "b": 3}
    assert "5" in str(turns[0]["result"]["output"]) and "5" in str(turns[1]["observation"])
    assert turns[1]["action"]["tool_args"] == {"answer": FINAL}
    assert TASK in traj["task_context"]["instructions"]
    assert traj["metadata"]["model"] == VERSION
    await feedback_gives_version_2(harness, session, traj["trajectory_id"])
    # 2) its OpenInference spans enriched that episode instead of making a second one
    # (the spans carry no response id: the tool call ids the gateway minted join them)
    cap = traj["metadata"]["capture"]
    assert len(cap["otlp"]["trace_ids"]) == 1 and cap["otlp"]["spans"] >= 3
    assert turns[0]["result"]["execution_time_ms"] >= 0  # the tool span's duration
    await asyncio.sleep(0.5)
    everything = await harness.trajectories()
    assert [t["trajectory_id"] for t in everything] == [traj["trajectory_id"]]
