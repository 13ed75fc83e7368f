"""The plugin at the edges of Agent Zero: no agentrl in its Python, secrets unmasked in place,
the observations Agent Zero really shows, a chat killed mid-monologue, an oversized tool
answer, and a spool file NATS can never take. Each through Agent Zero's extension interface
(the stand-ins in a0_standins) against a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from a0_kit import Checkout, stream_payloads, trajectories_of
from a0_standins import MISFORMAT, REPEAT, Extensions

from agentrl.bus.server import EmbeddedNats
from agentrl.contracts import TrajectoryEvent
from agentrl.contracts.base import new_id, utcnow
from agentrl.integrations.agent_zero import hooks
from agentrl.integrations.agent_zero.publisher import Outbox

HERE = Path(__file__).parent


def step(response: Any, message: Any = None, break_loop: bool = False, **tool: Any) -> dict:
    text = response if isinstance(response, str) else json.dumps(response, indent=2)
    return {"response": text, "tool": {"message": message, "break_loop": break_loop, **tool}}


def answer(text: str) -> dict[str, Any]:
    request = {"thoughts": ["Done."], "headline": "Answering", "tool_name": "response"}
    return step({**request, "tool_args": {"text": text}}, text, True)


def monologue(context_id: str, user: str, iterations: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "context_id": context_id,
        "agent": {"number": 0, "profile": "agent0"},
        "user_message": {"id": new_id(), "content": {"user_message": user}},
        "iterations": iterations,
    }


# ---- 2: the plugin in place, agentrl absent ------------------------------------------------


def test_without_agentrl_a_chat_still_answers(checkout: Checkout) -> None:
    """Agent Zero's Python without agentrl (here: the interpreter with no site-packages):
    every extension file imports, logs once, does nothing, and the monologue answers."""
    script = textwrap.dedent(
        f"""
        import asyncio, json, logging, sys
        sys.path.insert(0, {str(HERE)!r})
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
        from a0_standins import Driver, Extensions, install_standins
        from conftest_free import make_agent
        install_standins({str(checkout.root)!r})
        try:
            import agentrl  # noqa: F401
            sys.exit("agentrl is importable: the test proves nothing")
        except ImportError:
            pass
        rec = json.loads(open({str(HERE / "data" / "main_with_tools.json")!r}).read())
        from pathlib import Path
        ext = Extensions([Path({str(checkout.plugin_dir / "extensions" / "python")!r})])
        assert sum(len(v) for v in ext.by_point.values()) >= 9
        agent = make_agent(rec)
        print("ANSWER", asyncio.run(Driver(ext).monologue(agent, rec["iterations"])))
        """
    )
    free = checkout.root / "conftest_free.py"  # make_agent without conftest's agentrl imports
    free.write_text(
        textwrap.dedent(
            """
            from a0_standins import Agent, Config, Context, Message

            def make_agent(rec):
                spec = rec["agent"]
                agent = Agent(spec["number"], Config(spec["profile"]), Context(rec["context_id"]))
                um = rec["user_message"]
                agent.last_user_message = Message(um["content"], um.get("id", ""))
                return agent
            """
        )
    )
    out = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys; sys.path.insert(0, {str(checkout.root)!r})\n" + script,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # a Python without agentrl: not this checkout's PYTHONPATH (a worktree's tests set it)
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
    )
    assert out.returncode == 0, out.stderr
    assert "ANSWER The sum of [1, 2, 3] is 6." in out.stdout
    assert out.stderr.count("agentrl plugin inactive") == 1, out.stderr  # logged once


# ---- 5: secrets --------------------------------------------------------------------------

UNMASK = """
from helpers.extension import Extension

SECRETS = {"API_KEY": "sk-live-0123456789abcdef"}


class UnmaskToolSecrets(Extension):  # Agent Zero's _10_unmask_secrets: in place
    async def execute(self, tool_args=None, **kwargs):
        for k, v in (tool_args or {}).items():
            if isinstance(v, str):
                for name, value in SECRETS.items():
                    v = v.replace(f"§§secret({name})", value)
                tool_args[k] = v
"""


async def test_dirty_json_with_a_secret_placeholder_never_reaches_nats(
    checkout: Checkout, a0_nats: Any
) -> None:
    core = checkout.root / "extensions" / "python" / "tool_execute_before"
    core.mkdir(parents=True, exist_ok=True)
    (core / "_10_unmask_secrets.py").write_text(UNMASK)
    checkout.driver.ext = Extensions(
        [checkout.root / "extensions" / "python", checkout.plugin_dir / "extensions" / "python"]
    )
    dirty = (  # a trailing comma: Agent Zero's dirty-JSON parser takes it, json does not
        '{\n  "thoughts": ["Call the API with the stored key."],\n'
        '  "headline": "Calling the API",\n  "tool_name": "code_execution_tool",\n'
        '  "tool_args": {"runtime": "terminal", "code": '
        "\"curl -H 'Authorization: Bearer §§secret(API_KEY)' https://api.example.com/v1\",},\n}"
    )
    rec = monologue("a0-secret", "Call the API.", [step(dirty, "200 OK"), answer("It works.")])
    agent, got = await checkout.run(rec)
    assert got == "It works."
    assert "sk-live-0123456789abcdef" in checkout.driver.tool_args_seen[0]["code"]  # unmasked
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    wire = json.dumps(payload)
    assert "sk-live-0123456789abcdef" not in wire
    t1 = payload["turns"][0]
    assert "§§secret(API_KEY)" in t1["action"]["tool_args"]["code"]
    assert t1["thought_process"] == ["Call the API with the stored key."]
    assert t1["action"]["headline"] == "Calling the API"
    assert "parse_error" not in t1["action"] and t1["result"]["success"] is True


# ---- 6: observations are what the model was shown ------------------------------------------


async def test_observations_are_what_agent_zero_showed(checkout: Checkout, a0_nats: Any) -> None:
    ask = {
        "thoughts": ["List the files."],
        "headline": "Listing",
        "tool_name": "code_execution_tool",
        "tool_args": {"runtime": "terminal", "code": "ls"},
    }
    rec = monologue(
        "a0-observed",
        "What is in the folder?",
        [
            step(ask, "a.txt\nb.txt\n"),
            step(ask, "never run"),  # the same answer again: the repeat warning, no tool
            step("I think there are two files."),  # not JSON: the misformat warning
            answer("Two files: a.txt and b.txt."),
        ],
    )
    agent, got = await checkout.run(rec)
    assert got == "Two files: a.txt and b.txt."
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    obs = [t["observation"] for t in payload["turns"]]
    assert obs[1] == {"type": "tool_result", "content": "a.txt\nb.txt"}
    assert obs[2] == {"type": "system_message", "content": REPEAT}
    assert obs[3] == {"type": "system_message", "content": MISFORMAT}


# ---- 4: a chat killed, reset or removed mid-monologue ---------------------------------------


async def _started(checkout: Checkout, rec: dict[str, Any]) -> tuple[Any, asyncio.Task[Any]]:
    agent = checkout.agent(rec)
    task = asyncio.create_task(checkout.driver.monologue(agent, rec["iterations"]))
    for _ in range(500):  # until the blocking tool runs
        if len(checkout.driver.tool_args_seen) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(checkout.driver.tool_args_seen) == 2
    return agent, task


async def _published(url: str, session: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The session's trajectories, once the plugin's background loop published them."""
    end = asyncio.get_running_loop().time() + timeout
    while not (found := await trajectories_of(url, session)):
        if asyncio.get_running_loop().time() > end:
            break
        await asyncio.sleep(0.1)
    return found


async def _kill(task: asyncio.Task[Any]) -> None:
    task.cancel()  # DeferredTask.kill: the end hooks never run
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_killed_or_removed_chat_is_recorded_as_abandoned(
    checkout: Checkout, a0_nats: Any
) -> None:
    ask = {"thoughts": ["Run it."], "headline": "Running", "tool_name": "code_execution_tool"}
    slow = {**ask, "tool_args": {"runtime": "terminal", "code": "sleep 600"}}
    iterations = [
        step({**ask, "tool_args": {"runtime": "terminal", "code": "echo hi"}}, "hi\n"),
        step(slow, blocks=True),
        answer("never"),
    ]
    # kill_process (the stop button, and the first thing reset and nudge do)
    rec = monologue("a0-killed", "Run a long job.", iterations)
    agent, task = await _started(checkout, rec)
    point = "_functions/agent/AgentContext/kill_process/start"
    data = {"args": (agent.context,), "kwargs": {}, "result": None, "exception": None}
    checkout.extensions.call_sync(point, None, data=data)  # a sync @extensible method
    await _kill(task)
    (payload,) = await _published(a0_nats.url, agent.context.id)  # the background flush
    TrajectoryEvent.model_validate(payload)
    assert payload["metadata"]["outcome"]["task_abandoned"] is True
    assert payload["metadata"]["outcome"]["task_status"] == "failed"
    assert payload["metadata"]["abandoned"] == "killed"
    assert len(payload["turns"]) == 2 and "did not return" in payload["turns"][1]["result"]["error"]
    feedback = await stream_payloads(a0_nats.url, "agent.rl.feedback.v1")
    assert [f["type"] for f in feedback if f["trajectory_id"] == payload["trajectory_id"]] == [
        "abandoned"
    ]

    # AgentContext.remove(id): the context is found by its id
    checkout.driver.tool_args_seen.clear()
    rec = monologue("a0-removed", "Run another long job.", iterations)
    agent, task = await _started(checkout, rec)
    import agent as a0_agent  # the stand-in of Agent Zero's agent module

    a0_agent.AgentContext._contexts[agent.context.id] = agent.context
    point = "_functions/agent/AgentContext/remove/start"
    data = {"args": (agent.context.id,), "kwargs": {}, "result": None, "exception": None}
    checkout.extensions.call_sync(point, None, data=data)
    await _kill(task)
    (payload,) = await _published(a0_nats.url, agent.context.id)
    assert payload["metadata"]["abandoned"] == "removed"
    # a second kill (reset after stop) finds nothing left to record
    checkout.extensions.call_sync(point, None, data=data)
    await asyncio.sleep(0.3)
    assert len(await trajectories_of(a0_nats.url, agent.context.id)) == 1


# ---- issue 29 defect 10: size -----------------------------------------------------------


async def test_a_huge_tool_answer_is_cut_and_stored_once(checkout: Checkout, a0_nats: Any) -> None:
    big = "".join(f"row {i:06d} " + "x" * 50 + "\n" for i in range(10_000))  # ~600 KB
    ask = {
        "thoughts": ["Dump the table."],
        "headline": "Dumping",
        "tool_name": "code_execution_tool",
        "tool_args": {"runtime": "terminal", "code": "cat table.txt"},
    }
    rec = monologue("a0-big", "Dump the table.", [step(ask, big), answer("Done.")])
    agent, got = await checkout.run(rec)
    assert got == "Done."
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    size = len(json.dumps(payload).encode())
    assert size < 2 * 32_768 + 16_384, size  # the default budget, once (was ~1.25 MB)
    t1, t2 = payload["turns"]
    shown = t2["observation"]["content"]
    assert shown.startswith("row 000000") and shown.endswith("x" * 50)  # head and tail
    assert "bytes cut]" in shown
    assert t1["result"]["output_in_next_observation"] is True
    assert len(t1["result"]["output"].encode()) <= 1024
    checkout.write_config(max_text_bytes=4096)  # configurable
    agent, _ = await checkout.run(rec)
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    assert len(payload["turns"][1]["observation"]["content"].encode()) <= 4096


async def test_an_event_nats_refuses_is_set_aside_and_the_flush_goes_on(
    checkout: Checkout, tmp_path: Path, caplog: Any
) -> None:
    server = EmbeddedNats(data_dir=tmp_path / "nats-1m", max_payload=1024 * 1024)  # the default
    server.start()
    try:
        checkout.write_config(nats_url=server.url)
        await _set_aside_case(checkout, server, caplog)
    finally:
        server.stop()


async def _set_aside_case(checkout: Checkout, a0_nats: Any, caplog: Any) -> None:
    outbox = Outbox(hooks.config_for(checkout.plugin_dir / "plugin.yaml"))
    huge = TrajectoryEvent.model_validate(recording_payload("a0-huge", "y" * 1_300_000))
    small = TrajectoryEvent.model_validate(recording_payload("a0-small", "fine"))
    outbox.spool.put(huge)  # first in the queue: it used to block everything after it
    outbox.spool.put(small)
    with caplog.at_level("ERROR", logger="agentrl.agent_zero"):
        assert await outbox.flush() == 1
    assert outbox.last_error is None and len(outbox.spool) == 0
    assert outbox.set_aside == 1 and outbox.spool.bad_count() == 1
    (bad,) = checkout.spool_dir.glob("*.bad")
    assert "max_payload" in bad.with_suffix(".why").read_text()
    assert "can never be published" in caplog.text
    sessions = [p["session_id"] for p in await stream_payloads(a0_nats.url, huge.SUBJECT)]
    assert "a0-small" in sessions and "a0-huge" not in sessions


def recording_payload(session: str, instructions: str) -> dict[str, Any]:
    now = utcnow()
    return {
        "trajectory_id": new_id(),
        "session_id": session,
        "agent_id": "agent-zero-main",
        "start_timestamp": now,
        "end_timestamp": now,
        "turns": [
            {
                "turn_id": 1,
                "timestamp": now,
                "observation": {"type": "user_message", "content": instructions},
                "action": {"type": "response", "tool_name": "response"},
                "result": {"success": True, "output": "ok"},
            }
        ],
        "task_context": {"task_id": new_id(), "instructions": instructions, "domain": "general"},
        "metadata": {"model": "agentrl-policy"},
    }


def test_dirty_json_is_read_like_agent_zero_reads_it() -> None:
    from agentrl.integrations.agent_zero.recorder import parse_response

    want = {"thoughts": ["a"], "tool_name": "response", "tool_args": {"text": "§§secret(K)"}}
    for text in (
        '{"thoughts": ["a",], "tool_name": "response", "tool_args": {"text": "§§secret(K)",},}',
        "{'thoughts': ['a'], 'tool_name': 'response', 'tool_args': {'text': '§§secret(K)'}}",
        '{thoughts: ["a"], tool_name: response, tool_args: {text: "§§secret(K)"}}',
        'Sure: {"thoughts": ["a"], "tool_name": "response", "tool_args": {"text": "§§secret(K)"}}',
    ):
        assert parse_response(text) == (want, None), text
    assert parse_response("no json here")[0] is None
    assert parse_response('{"thoughts": ["unclosed}')[0] is None
