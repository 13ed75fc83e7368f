"""agentrl-a0-client on its own (CI runs these on Python 3.12, Agent Zero's version, in an
environment with only the client, pytest and a nats-server binary): the recorder, the
redacting spool and the publisher against a real nats-server, and no torch anywhere."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from agentrl.bus.server import EmbeddedNats, free_port
from agentrl.integrations.agent_zero.config import AgentZeroConfig
from agentrl.integrations.agent_zero.feedback import feedback_event
from agentrl.integrations.agent_zero.publisher import Outbox
from agentrl.integrations.agent_zero.recorder import Identity, TrajectoryRecorder

SECRET = "sk-live-0123456789abcdef"


def test_only_the_client_is_here() -> None:
    assert importlib.util.find_spec("torch") is None
    assert importlib.util.find_spec("agentrl.training") is None  # not shipped
    assert sys.version_info >= (3, 11)


def monologue(session: str, tool_output: str = "6\n") -> TrajectoryRecorder:
    rec = TrajectoryRecorder(
        Identity(session), "Sum [1, 2, 3]; mail jane.doe@example.com", max_text_bytes=4096
    )
    rec.begin_turn()
    rec.response_text(  # dirty JSON (a trailing comma) with a secret placeholder
        '{"thoughts": ["run it"], "headline": "Running", "tool_name": "code_execution_tool",'
        ' "tool_args": {"code": "curl -H \'key: §§secret(KEY)\' x && python -c 1",},}'
    )
    rec.tool_started("code_execution_tool", {"code": "curl -H 'key: §§secret(KEY)' x"})
    rec.tool_finished("code_execution_tool", tool_output)
    rec.end_turn()
    rec.observed("tool_result", tool_output.strip())
    rec.begin_turn()
    rec.response_text('{"tool_name": "response", "tool_args": {"text": "6"}}')
    rec.tool_started("response", {"text": "6"})
    rec.tool_finished("response", "6", break_loop=True)
    return rec


def test_recorder_keeps_placeholders_and_cuts_big_answers() -> None:
    event = monologue("s-1", tool_output="x" * 100_000).finish()
    assert event is not None
    t1, t2 = event.turns
    assert "§§secret(KEY)" in t1.action.tool_args["code"] and SECRET not in event.to_json().decode()
    assert t1.thought_process == ["run it"]
    assert len(t2.observation.content.encode()) <= 4096
    assert len(event.to_json()) < 16_384


async def test_spool_redacts_then_publishes_to_a_real_nats(tmp_path: Path) -> None:
    port = free_port()
    config = AgentZeroConfig(
        nats_url=f"nats://127.0.0.1:{port}",
        spool_dir=str(tmp_path / "spool"),
        publish_timeout_s=1.0,
        connect_timeout_s=0.5,
    )
    outbox = Outbox(config)
    event = monologue("s-2").finish()
    assert event is not None
    assert await outbox.send([event, feedback_event(event.trajectory_id, "thumbs_up")]) == 0
    spooled = b"".join(p.read_bytes() for p in (tmp_path / "spool").glob("*.event"))
    assert b"jane.doe@example.com" not in spooled and len(outbox.spool) == 2
    try:
        server = EmbeddedNats(data_dir=tmp_path / "nats", port=port)
    except Exception as exc:  # pragma: no cover - no nats-server binary here
        pytest.skip(f"no nats-server: {exc}")
    server.start()
    try:
        assert await outbox.flush(force=True) == 2
        import nats

        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            msg = await js.get_last_msg("RL_TRAJECTORIES", "agent.rl.trajectory.v1")
            assert json.loads(msg.data)["session_id"] == "s-2"
        finally:
            await nc.close()
    finally:
        server.stop()


def test_the_structured_outputs_schema_ships_with_the_client() -> None:
    from agentrl.integrations.agent_zero import structured

    fmt = structured.response_format(["response", "code_execution_tool"])
    schema = fmt["json_schema"]["schema"]
    assert set(schema["required"]) == {"thoughts", "headline", "tool_name", "tool_args"}
    assert schema["properties"]["tool_name"]["anyOf"][0]["enum"] == [
        "code_execution_tool",
        "response",
    ]


def test_secret_values_are_masked_in_every_text_field() -> None:
    from agentrl.integrations.agent_zero.masking import mask_event

    value = "correct-horse-battery-staple-42"
    rec = TrajectoryRecorder(Identity("s-3"), f"log in with {value}")
    rec.begin_turn()
    rec.response_text(f'{{"thoughts": ["use {value}",], "tool_name": "response",}}')
    rec.tool_started("response", {"text": value})
    rec.tool_finished("response", f"done with {value}", break_loop=True)
    event = rec.finish()
    assert event is not None and value in event.to_json().decode()
    masked = mask_event(event, {"db_pass": value, "short": "abc"})
    wire = masked.to_json().decode()
    assert value not in wire and wire.count("§§secret(DB_PASS)") >= 4
    assert masked.turns[0].thought_process == ["use §§secret(DB_PASS)"]


async def test_the_background_loop_publishes_without_an_event_loop_of_ours(
    tmp_path: Path,
) -> None:
    """A chat reset from a sync call: spooled, then published by the plugin's own loop."""
    import asyncio

    from agentrl.integrations.agent_zero import background

    try:
        server = EmbeddedNats(data_dir=tmp_path / "nats")
    except Exception as exc:  # pragma: no cover - no nats-server binary here
        pytest.skip(f"no nats-server: {exc}")
    server.start()
    try:
        config = AgentZeroConfig(nats_url=server.url, spool_dir=str(tmp_path / "spool"))
        outbox = Outbox(config)
        event = monologue("s-4").finish()
        assert event is not None
        outbox.spool_events([event, feedback_event(event.trajectory_id, "abandoned")])
        future = background.kick(outbox)
        assert await asyncio.wrap_future(future) == 2
        assert len(outbox.spool) == 0
    finally:
        server.stop()
