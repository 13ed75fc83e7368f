"""Feedback from Agent Zero's web UI: the thumbs the plugin adds to each message call its
API (`/plugins/agentrl/feedback`, the handler in the plugin's `api/feedback.py`), which sends
agent.rl.feedback.v1 for the trajectory of the monologue that wrote that message, through
the spool while NATS is away. A retry (the same question again) is an implicit correction."""

from __future__ import annotations

import json
from typing import Any

from a0_kit import Checkout, recording, stream_payloads, trajectories_of
from a0_standins import Message, import_file

from agentrl.bus.server import free_port


def handler(checkout: Checkout) -> Any:
    module = import_file(checkout.plugin_dir / "api" / "feedback.py")
    return module.Feedback(app=None, thread_lock=None)


async def feedback_on(url: str, trajectory_id: str) -> list[dict[str, Any]]:
    return [
        f
        for f in await stream_payloads(url, "agent.rl.feedback.v1")
        if f["trajectory_id"] == trajectory_id
    ]


async def test_thumbs_land_on_the_monologue_that_wrote_the_message(
    checkout: Checkout, a0_nats: Any
) -> None:
    import agent as a0_agent  # the stand-in of Agent Zero's agent module

    rec = recording("main_with_tools")
    agent, _ = await checkout.run(rec)
    first_end = len(agent.context.log.logs) - 1
    agent.last_user_message = Message({"user_message": "Now 4+5?"}, "m2")
    await checkout.run(rec, agent)  # a second question in the same chat
    a0_agent.AgentContext._contexts[agent.context.id] = agent.context
    t1, t2 = await trajectories_of(a0_nats.url, agent.context.id)

    api = handler(checkout)
    got = await api.process(
        {"context": agent.context.id, "log_no": first_end, "kind": "thumbs_down"}, None
    )
    assert got == {"ok": True, "trajectory_id": t1["trajectory_id"], "published": True}
    last = len(agent.context.log.logs) - 1
    got = await api.process(
        {"context": agent.context.id, "log_no": last, "kind": "thumbs_up"}, None
    )
    assert got["trajectory_id"] == t2["trajectory_id"]
    assert [f["type"] for f in await feedback_on(a0_nats.url, t1["trajectory_id"])] == [
        "thumbs_down"
    ]
    (up,) = await feedback_on(a0_nats.url, t2["trajectory_id"])
    assert up["type"] == "thumbs_up" and up["source"] == "agent-zero"
    assert up["session_id"] == agent.context.id

    bad = await api.process({"context": agent.context.id, "log_no": 0, "kind": "meh"}, None)
    assert bad["ok"] is False and "thumbs_up" in bad["message"]
    missing = await api.process({"context": "nope", "kind": "thumbs_up"}, None)
    assert missing.status == 404

    # NATS away: the thumb is spooled, and the next flush delivers it
    checkout.write_config(nats_url=f"nats://127.0.0.1:{free_port()}", publish_timeout_s=0.5)
    got = await api.process(
        {"context": agent.context.id, "log_no": last, "kind": "thumbs_down"}, None
    )
    assert got["ok"] is True and got["published"] is False
    assert len(list(checkout.spool_dir.glob("*.event"))) == 1
    checkout.write_config(nats_url=a0_nats.url)
    await checkout.run(rec)  # the next monologue's start flushes the spool
    kinds = [f["type"] for f in await feedback_on(a0_nats.url, t2["trajectory_id"])]
    assert kinds == ["thumbs_up", "thumbs_down"]


async def test_a_retry_is_an_implicit_correction(checkout: Checkout, a0_nats: Any) -> None:
    rec = recording("main_with_tools")
    agent, _ = await checkout.run(rec)
    (first,) = await trajectories_of(a0_nats.url, agent.context.id)
    await checkout.run(rec, agent)  # the user asks the same again
    (fb,) = await feedback_on(a0_nats.url, first["trajectory_id"])
    assert fb["type"] == "correction" and "asked again" in fb["comment"]
    agent.last_user_message = Message({"user_message": "Thanks, bye."}, "m3")
    await checkout.run(rec, agent)  # a different message: no signal
    second = (await trajectories_of(a0_nats.url, agent.context.id))[1]
    assert await feedback_on(a0_nats.url, second["trajectory_id"]) == []


def test_the_web_ui_adds_thumbs_that_call_the_plugin_api(checkout: Checkout) -> None:
    js = checkout.plugin_dir / "extensions" / "webui" / "set_messages_after_loop"
    (script,) = js.glob("*.js")
    text = script.read_text()
    assert '"/plugins/agentrl/feedback"' in text and "log_no" in text
    assert "thumbs_up" in text and "thumbs_down" in text
    assert json.dumps("export default")[1:-1] in text  # an ES module Agent Zero imports
