"""OpenAIAgentPolicy through the official SDK against a real local HTTP server."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agentrl.bench.testing_server import ScriptedOpenAIServer, ScriptedReply, tool_call
from agentrl.rollout import Message, PolicyError, RLRolloutWorker, TaskDefinition
from agentrl.rollout.policies import OpenAIAgentPolicy
from agentrl.rollout.worker import CRITICAL_ERROR

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def a0(tool: str, **args: Any) -> str:
    return (
        "Thinking out loud.\n```json\n"
        + json.dumps({"thoughts": ["t1"], "headline": "h", "tool_name": tool, "tool_args": args})
        + "\n```"
    )


async def test_agent_zero_reply_with_logprobs_over_http() -> None:
    text = a0("calculator", expression="6*7")
    with ScriptedOpenAIServer([ScriptedReply(content=text)]) as server:
        policy = OpenAIAgentPolicy(
            "scripted", base_url=server.base_url, temperature=0.3, max_tokens=64
        )
        action, raw, log_probs, value = await policy.get_action(
            [Message(role="system", content="be brief"), Message(role="user", content="6*7?")],
            TOOLS,
        )
        request = server.requests[0]
    assert action["type"] == "tool_call" and action["name"] == "calculator"
    assert action["arguments"] == {"expression": "6*7"} and action["thoughts"] == ["t1"]
    assert raw == text and value is None
    # The request carried what we asked for.
    assert request["logprobs"] is True and request["temperature"] == 0.3
    assert request["max_tokens"] == 64 and request["tools"] == TOOLS
    assert request["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "6*7?"},
    ]
    assert log_probs is not None
    assert "".join(log_probs["tokens"]) == text
    assert log_probs["sum"] == pytest.approx(sum(log_probs["token_logprobs"]))
    assert log_probs["usage"]["completion_tokens"] == len(log_probs["tokens"])
    assert policy.total_tokens == log_probs["usage"]["total_tokens"] > 0


async def test_native_tool_calls_and_bare_function_specs() -> None:
    reply = ScriptedReply(
        content=None, tool_calls=[tool_call("calculator", {"expression": "1+1"}, "call_7")]
    )
    with ScriptedOpenAIServer([reply]) as server:
        policy = OpenAIAgentPolicy("m", base_url=server.base_url)
        action, raw, log_probs, _ = await policy.get_action("1+1?", [TOOLS[0]["function"]])
        assert server.requests[0]["tools"] == TOOLS  # bare schema wrapped into OpenAI's shape
    assert action == {
        "type": "tool_call",
        "name": "calculator",
        "arguments": {"expression": "1+1"},
        "id": "call_7",
        "final": False,
    }
    assert raw is None  # no content tokens, no log-probs; the id and model are kept
    assert log_probs is not None and "token_logprobs" not in log_probs
    assert log_probs["model"] == "m" and log_probs["completion_id"].startswith("chatcmpl-")


async def test_retries_with_backoff_then_succeeds() -> None:
    script = [ScriptedReply(status=503), ScriptedReply(status=500), ScriptedReply(content="left")]
    with ScriptedOpenAIServer(script) as server:
        policy = OpenAIAgentPolicy("m", base_url=server.base_url, max_retries=3, backoff_base=0.05)
        started = time.perf_counter()
        action, _, _, _ = await policy.get_action("go")
        elapsed = time.perf_counter() - started
        assert len(server.requests) == 3
    assert action == {"type": "text", "content": "left"}
    assert policy.failed_attempts == 2
    assert elapsed >= 0.05 + 0.1  # two backoff sleeps: 0.05 * 2**0 and 0.05 * 2**1


async def test_client_error_is_not_retried() -> None:
    with ScriptedOpenAIServer([ScriptedReply(status=400)]) as server:
        policy = OpenAIAgentPolicy("m", base_url=server.base_url, max_retries=3, backoff_base=0.01)
        with pytest.raises(PolicyError, match="refused"):
            await policy.get_action("go")
        assert len(server.requests) == 1


async def test_timeouts_are_retried() -> None:
    # a timeout of a second, not less: a reply a loaded host (load 13) takes 0.2 s over is
    # not slow; the slow one sleeps twice past it (the server stops when it has replied)
    script = [ScriptedReply(content="slow", delay=2.0), ScriptedReply(content="fast")]
    with ScriptedOpenAIServer(script) as server:
        policy = OpenAIAgentPolicy(
            "m", base_url=server.base_url, timeout=1.0, max_retries=1, backoff_base=0.01
        )
        action, _, _, _ = await policy.get_action("go")
    assert action["content"] == "fast" and policy.failed_attempts == 1


async def test_server_errors_end_the_episode_with_a_critical_error() -> None:
    class OneCell:
        env_id = "cell"

        def reset(self, seed: int | None = None) -> dict[str, Any]:
            return {"text": "a room", "anchor": "room"}

        def step(self, action_text: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
            return {"text": "still a room", "anchor": "room"}, 0.0, False, {"invalid_action": False}

    script = [ScriptedReply(content="look"), ScriptedReply(status=500)]
    with ScriptedOpenAIServer(script) as server:
        policy = OpenAIAgentPolicy("m", base_url=server.base_url, max_retries=2, backoff_base=0.01)
        task = TaskDefinition(name="t", env_id="cell", max_episode_steps=10)
        episode = await RLRolloutWorker(task, policy, lambda env_id, **kw: OneCell()).run()
        assert len(server.requests) == 1 + 3  # one success, then 1 + 2 retries
    assert len(episode.steps) == 2
    assert episode.termination_reason == CRITICAL_ERROR
    info = episode.steps[-1].step_info
    assert info["error_source"] == "policy"
    assert (
        "failed 3 times" in info["critical_error"]
        and "InternalServerError" in info["critical_error"]
    )
    assert episode.steps[0].policy_logprobs is not None  # the good step kept its log-probs


async def test_unreachable_endpoint_raises_policy_error() -> None:
    server = ScriptedOpenAIServer([ScriptedReply(content="x")]).start()
    url = server.base_url
    server.stop()  # nothing listens there any more
    policy = OpenAIAgentPolicy("m", base_url=url, max_retries=1, backoff_base=0.01, timeout=2)
    with pytest.raises(PolicyError, match="is the server up"):
        await policy.get_action("go")
    assert policy.failed_attempts == 2


async def test_multi_turn_tool_episode_feeds_tool_messages_back() -> None:
    """Native tool calls produce assistant(tool_calls) + tool(tool_call_id) messages that the
    next request carries back to the server."""

    class Calc:
        env_id = "calc"

        def reset(self, seed: int | None = None) -> dict[str, Any]:
            return {"text": "What is 2+3?", "anchor": "q"}

        def step(self, action_text: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
            act = json.loads(action_text)
            if act["tool_name"] == "calculator":
                return {"text": "5", "anchor": "q|5"}, 0.0, False, {"invalid_action": False}
            ok = act["tool_args"].get("text") == "5"
            return {"text": "bye", "anchor": "end"}, float(ok), True, {"success": ok}

    script = [
        ScriptedReply(tool_calls=[tool_call("calculator", {"expression": "2+3"}, "c1")]),
        ScriptedReply(content=a0("response", text="5")),
    ]
    with ScriptedOpenAIServer(script) as server:
        policy = OpenAIAgentPolicy("m", base_url=server.base_url)
        task = TaskDefinition(name="calc", env_id="calc", tool_specs=TOOLS, ground_truth="5")
        steps, messages, truth = await RLRolloutWorker(
            task, policy, lambda e, **k: Calc()
        ).run_episode()
        second = server.requests[1]["messages"]
    assert truth == "5" and steps[-1].base_reward == 1.0 and steps[-1].step_info["success"]
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert second[1]["tool_calls"][0]["id"] == "c1"
    assert second[2] == {"role": "tool", "content": "5", "tool_call_id": "c1", "name": "calculator"}


async def test_the_policy_sends_the_body_chat_completions_create_sends() -> None:
    """The policy posts /chat/completions through the client itself (without the SDK's walk
    of its typed parameters): the server gets the body `create` sends for the same call,
    `extra_body` merged last."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "6*7?"}]
    with ScriptedOpenAIServer([ScriptedReply(content="42")] * 2) as server:
        policy = OpenAIAgentPolicy(
            "scripted",
            base_url=server.base_url,
            temperature=0.3,
            max_tokens=64,
            top_logprobs=2,
            extra_body={"episode_id": "e-1", "temperature": 0.9},
        )
        await policy.get_action([Message(**m) for m in messages], TOOLS)
        await policy.client.chat.completions.create(
            model="scripted",
            messages=messages,  # type: ignore[arg-type]
            temperature=0.3,
            max_tokens=64,
            logprobs=True,
            top_logprobs=2,
            tools=TOOLS,  # type: ignore[arg-type]
            extra_body={"episode_id": "e-1", "temperature": 0.9},
        )
        ours, sdks = server.requests
    assert ours == sdks
    assert ours["temperature"] == 0.9 and ours["episode_id"] == "e-1"
