"""Recorded Agent Zero loop data driven through the installed plugin's extensions; the
published `agent.rl.trajectory.v1` events checked field by field on a real nats-server."""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from a0_kit import Checkout, recording, trajectories_of

from agentrl.contracts import TrajectoryEvent
from agentrl.contracts.schemas import wire_schema

SEED_TOP = {
    "trajectory_id",
    "session_id",
    "agent_id",
    "subordinate_profile",
    "start_timestamp",
    "end_timestamp",
    "turns",
    "task_context",
    "metadata",
}


def no_nulls(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, dict):
        return all(no_nulls(v) for v in value.values())
    if isinstance(value, list):
        return all(no_nulls(v) for v in value)
    return True


def check_wire(payload: dict[str, Any]) -> TrajectoryEvent:
    import jsonschema  # here, not at the top: ~2 s of CPU in every collecting process

    assert set(payload) <= SEED_TOP
    assert no_nulls(payload)
    assert str(uuid.UUID(payload["trajectory_id"])) == payload["trajectory_id"]
    schema = wire_schema(TrajectoryEvent)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    errors = list(
        jsonschema.Draft202012Validator(schema, format_checker=checker).iter_errors(payload)
    )
    assert [e.message for e in errors] == []
    pmoves = os.environ.get("AGENTRL_PMOVES_SCHEMAS")  # PMOVES.AI's schemas/agent-rl folder
    if pmoves:
        theirs = json.loads((Path(pmoves) / "trajectory.v1.schema.json").read_text())
        v = jsonschema.Draft202012Validator(theirs, format_checker=checker)
        assert [e.message for e in v.iter_errors(payload)] == []
    return TrajectoryEvent.model_validate(payload)


def response_of(rec: dict[str, Any], i: int) -> dict[str, Any]:
    return json.loads(rec["iterations"][i]["response"])


async def test_main_agent_with_tool_calls(
    checkout: Checkout, a0_nats: Any, monkeypatch: Any
) -> None:
    from agentrl.integrations.agent_zero import capture

    monkeypatch.setattr(capture, "ensure_litellm_callback", lambda: False)  # no LiteLLM
    rec = recording("main_with_tools")
    agent, answer = await checkout.run(rec)
    assert answer == "The sum of [1, 2, 3] is 6."
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    event = check_wire(payload)
    assert agent.context.data["_agentrl_last_trajectory_id"] == payload["trajectory_id"]

    assert payload["agent_id"] == "agent-zero-main"
    assert "subordinate_profile" not in payload  # agent0 is not one of the schema's profiles
    meta = payload["metadata"]
    assert meta["agent_profile"] == "agent0" and meta["agent_number"] == 0
    assert meta["model"] == "agentrl-policy"  # no serving version reported: the public name
    assert meta["outcome"]["task_status"] == "completed_successfully"
    assert meta["outcome"]["completion_percentage"] == 1.0
    ctx = payload["task_context"]
    assert ctx["task_id"] == "msg-0001" and ctx["domain"] == "general"
    # redacted at the edge: the e-mail address never leaves the agent
    assert "jane.doe@example.com" not in json.dumps(payload)
    assert ctx["instructions"].startswith("Sum the list [1, 2, 3] in Python")
    assert "[REDACTED:EMAIL]" in ctx["instructions"].upper()

    t1, t2 = payload["turns"]
    first = response_of(rec, 0)
    assert t1["turn_id"] == 1 and t2["turn_id"] == 2
    assert t1["observation"] == {"type": "user_message", "content": ctx["instructions"]}
    assert t1["thought_process"] == first["thoughts"]
    assert t1["action"].pop("llm_time_ms") >= 0
    assert t1["action"] == {
        "type": "tool_call",
        "tool_name": "code_execution_tool",
        "tool_args": first["tool_args"],
        "raw_response": rec["iterations"][0]["response"],
        "headline": first["headline"],
    }
    assert t1["result"]["success"] is True and t1["result"]["output"] == "6\n"
    assert t1["result"]["execution_time_ms"] >= 0
    # what the model was shown next: Agent Zero's tool result message (stripped)
    assert t2["observation"] == {"type": "tool_result", "content": "6"}
    assert t2["action"]["type"] == "response" and t2["action"]["tool_name"] == "response"
    assert t2["action"]["tool_args"] == {"text": "The sum of [1, 2, 3] is 6."}
    assert t2["result"]["output"] == "The sum of [1, 2, 3] is 6."
    assert event.start_timestamp <= event.turns[0].timestamp <= event.end_timestamp
    assert not list(checkout.spool_dir.glob("*.event"))  # delivered, nothing left spooled


async def test_serving_version_completion_ids_and_usage(
    checkout: Checkout, a0_nats: Any, monkeypatch: Any
) -> None:
    """With LiteLLM present (here: its success callback played by the stand-in chat model),
    each turn carries the gateway's completion id and serving version, and the trajectory
    the version and the token total."""
    from agentrl.integrations.agent_zero import capture

    monkeypatch.setattr(capture, "ensure_litellm_callback", lambda: True)
    checkout.driver.api_base = "http://127.0.0.1:8700/v1/"  # the chat model -> our gateway
    rec = recording("main_with_tools")
    agent, _ = await checkout.run(rec)
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    check_wire(payload)
    served = [it["served"] for it in rec["iterations"]]
    assert payload["metadata"]["model"] == "agentrl-policy-v3"
    assert payload["metadata"]["total_tokens"] == sum(s["usage"]["total_tokens"] for s in served)
    for turn, s in zip(payload["turns"], served, strict=True):
        assert turn["action"]["completion_id"] == s["id"]
        assert turn["action"]["model"] == "agentrl-policy-v3"
        assert turn["action"]["usage"] == s["usage"]
    assert capture.take("anything") is None and not capture._results  # nothing left behind
    # every call carried the chat as the gateway's sticky-session key, and opted out of the
    # gateway's own capture (the plugin publishes the monologue itself)
    for model in checkout.driver.calls:
        seen = model._inner.kwargs_seen
        assert seen["extra_headers"] == {
            "x-agentrl-session": agent.context.id,
            "x-agentrl-call-id": seen["metadata"]["agentrl_call_id"],
            "x-agentrl-capture": "off",
            "x-agentrl-agent": "agent-zero-main",  # the gateway routes it to its lineage
            "x-agentrl-profile": "agent0",
        }
        assert seen["metadata"]["agentrl_call_id"]
        assert seen["stream_options"] == {"include_usage": True}
    # another endpoint: tagged for the capture only, nothing agentrl-specific is sent
    checkout.driver.api_base, checkout.driver.calls = "https://openrouter.ai/api/v1", []
    await checkout.run(rec)
    for model in checkout.driver.calls:
        assert set(model._inner.kwargs_seen) == {"metadata"}


async def test_subordinate_call(checkout: Checkout, a0_nats: Any) -> None:
    rec = recording("subordinate_call")
    agent, answer = await checkout.run(rec)
    assert answer.startswith("Here it is")
    sub_payload, main_payload = await trajectories_of(a0_nats.url, agent.context.id)
    check_wire(sub_payload)
    check_wire(main_payload)
    # the subordinate's monologue ends first, so its trajectory is published first
    assert sub_payload["agent_id"] == "subordinate-developer-1"
    assert sub_payload["subordinate_profile"] == "developer"
    sm = sub_payload["metadata"]
    assert sm["parent_agent_id"] == "agent-zero-main"
    assert sm["parent_trajectory_id"] == main_payload["trajectory_id"]
    assert sm["agent_number"] == 1
    delegated = response_of(rec, 0)["tool_args"]["message"]
    assert sub_payload["task_context"]["instructions"] == delegated
    assert sub_payload["turns"][0]["observation"]["content"] == delegated
    assert [t["action"]["tool_name"] for t in sub_payload["turns"]] == [
        "code_execution_tool",
        "response",
    ]
    assert sub_payload["turns"][1]["observation"] == {"type": "tool_result", "content": "cba"}

    m1, m2 = main_payload["turns"]
    assert m1["action"]["type"] == "subordinate_call"
    assert m1["action"]["tool_args"]["profile"] == "developer"
    assert m1["result"]["success"] is True
    assert m1["result"]["output"] == "def reverse(s):\n    return s[::-1]"
    assert m1["result"]["subordinate_trajectory_id"] == sub_payload["trajectory_id"]
    assert m1["result"]["subordinate_agent_id"] == "subordinate-developer-1"
    assert m2["observation"]["type"] == "subordinate_response"
    assert m2["observation"]["content"] == m1["result"]["output"]


async def test_failed_tool_and_malformed_result(checkout: Checkout, a0_nats: Any) -> None:
    rec = recording("failed_tool")
    agent, answer = await checkout.run(rec)
    assert answer is not None
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    check_wire(payload)
    t1, t2, t3 = payload["turns"]
    assert t1["action"]["tool_name"] == "code_execution_tool"
    assert t1["result"]["success"] is False and "output" not in t1["result"]
    assert "did not return" in t1["result"]["error"]
    # the error text Agent Zero put into the history is what the model saw next
    assert t2["observation"] == {
        "type": "system_message",
        "content": f"RuntimeError: {rec['iterations'][0]['tool']['raises']}",
    }
    assert t2["result"]["success"] is False and t2["result"]["malformed"] is True
    assert json.loads(t2["result"]["output"]) == rec["iterations"][1]["tool"]["message"]
    assert t3["observation"]["type"] == "system_message"
    assert "AttributeError" in t3["observation"]["content"]  # .strip() on a dict failed
    assert t3["result"]["success"] is True
    assert payload["metadata"]["outcome"]["task_status"] == "completed_successfully"


async def test_non_json_response_is_a_parse_failure_turn(checkout: Checkout, a0_nats: Any) -> None:
    rec = recording("non_json_response")
    agent, answer = await checkout.run(rec)
    assert answer == "42"
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    check_wire(payload)
    t1, t2 = payload["turns"]
    assert t1["action"]["type"] == "response"
    assert t1["action"]["raw_response"] == "6 times 7 is 42."
    assert "not a JSON tool request" in t1["action"]["parse_error"]
    assert "tool_name" not in t1["action"] and t1["thought_process"] == []
    assert t1["result"]["success"] is False and "JSON" in t1["result"]["error"]
    assert t2["observation"]["type"] == "system_message"
    assert t2["result"] == {
        "success": True,
        "output": "42",
        "execution_time_ms": t2["result"]["execution_time_ms"],
    }


async def test_an_extension_error_never_breaks_the_loop(
    checkout: Checkout, a0_nats: Any, caplog: Any
) -> None:
    (checkout.plugin_dir / "config.json").write_text("{ this is not json")
    from agentrl.integrations.agent_zero import state

    state.reset_caches()
    rec = recording("main_with_tools")
    with caplog.at_level(logging.ERROR, logger="agentrl.agent_zero"):
        agent, answer = await checkout.run(rec)
    assert answer == "The sum of [1, 2, 3] is 6."  # Agent Zero went on
    assert "monologue_start failed" in caplog.text
    assert await trajectories_of(a0_nats.url, agent.context.id) == []


async def test_opt_out_publishes_nothing(checkout: Checkout, a0_nats: Any) -> None:
    rec = recording("main_with_tools")
    agent = checkout.agent(rec)
    agent.context.set_data("rl_opt_out", True)  # this chat is not for training
    _, answer = await checkout.run(rec, agent)
    assert answer is not None
    checkout.write_config(opt_out=True)
    other, _ = await checkout.run(rec)
    assert await trajectories_of(a0_nats.url, agent.context.id) == []
    assert await trajectories_of(a0_nats.url, other.context.id) == []
    assert not list(checkout.spool_dir.glob("*.event"))


async def test_settings_saved_while_running_are_picked_up(checkout: Checkout) -> None:
    from agentrl.integrations.agent_zero import hooks

    shim = checkout.plugin_dir / "extensions" / "python" / "monologue_end" / "x.py"
    assert hooks.config_for(shim).opt_out is False
    import os
    import time as _time

    saved = checkout.plugin_dir / "config.json"
    data = json.loads(saved.read_text())
    saved.write_text(json.dumps({**data, "opt_out": True, "domain": "coding"}))
    later = _time.time() + 2
    os.utime(saved, (later, later))  # a save Agent Zero's settings screen makes
    cfg = hooks.config_for(shim)
    assert cfg.opt_out is True and cfg.domain == "coding"
    assert hooks.outbox_for(cfg).config is cfg
