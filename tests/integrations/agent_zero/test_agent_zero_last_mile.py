"""Issue 51, the last mile, each through the installed plugin's real extension files called as
Agent Zero calls them (a0_standins) against a real nats-server: no secret of Agent Zero's
store in clear whatever the order of extensions, a project's opt-out honoured whatever the
agent's profile, a reset chat published within seconds from a short-lived loop, the model
that answered on every turn, and a thumbs-down's one-line correction."""

from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from a0_kit import Checkout, recording, stream_payloads, trajectories_of
from a0_standins import ChatModel, Extensions, import_file
from test_agent_zero_edges import answer, monologue, step

from agentrl.bus.server import free_port

# values the PII redactor leaves alone: only the secrets masking can catch them
SECRETS = {"DB_PASS": "correct-horse-battery-staple-42", "QUOTED": 'open"sesame-77'}

# Agent Zero's own secret extensions (helpers/secrets.py's manager, as its
# _10_unmask_secrets, _10_mask_secrets and _10_mask_content use it), here at positions that
# run them AFTER the plugin's: whatever the order, nothing may leak
A0_SECRET_EXTENSIONS = {
    "tool_execute_before/_01_unmask_secrets.py": """
        from helpers.extension import Extension
        from helpers.secrets import get_secrets_manager


        class Unmask(Extension):
            async def execute(self, tool_args=None, **kwargs):
                manager = get_secrets_manager(self.agent.context)
                for k, v in (tool_args or {}).items():
                    if isinstance(v, str):
                        tool_args[k] = manager.replace_placeholders(v)
    """,
    "tool_execute_after/_90_mask_secrets.py": """
        from helpers.extension import Extension
        from helpers.secrets import get_secrets_manager


        class Mask(Extension):
            async def execute(self, response=None, **kwargs):
                if response is not None and isinstance(response.message, str):
                    manager = get_secrets_manager(self.agent.context)
                    response.message = manager.mask_values(response.message)
    """,
    "hist_add_before/_95_mask_content.py": """
        from helpers.extension import Extension
        from helpers.secrets import get_secrets_manager


        def _mask(value, manager):
            if isinstance(value, str):
                return manager.mask_values(value)
            if isinstance(value, dict):
                return {k: _mask(v, manager) for k, v in value.items()}
            if isinstance(value, list):
                return [_mask(v, manager) for v in value]
            return value


        class MaskHistory(Extension):
            def execute(self, content_data=None, **kwargs):
                if content_data:
                    manager = get_secrets_manager(self.agent.context)
                    content_data["content"] = _mask(content_data["content"], manager)
    """,
}


def with_a0_secret_extensions(checkout: Checkout) -> None:
    core = checkout.root / "extensions" / "python"
    for rel, text in A0_SECRET_EXTENSIONS.items():
        path = core / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    lines = [f"{k}={v}" for k, v in SECRETS.items()]
    (checkout.root / "usr" / "secrets.env").write_text("\n".join(lines) + "\n")
    checkout.driver.ext = Extensions([core, checkout.plugin_dir / "extensions" / "python"])


def leaks(blob: str) -> list[str]:
    """The secret values (in any spelling) found in `blob`."""
    found = []
    for value in SECRETS.values():
        escaped = json.dumps(value)[1:-1]  # inside a JSON string (an answer's raw text)
        for spelling in {value, escaped, json.dumps(escaped)[1:-1]}:
            if spelling in blob:
                found.append(spelling)
    return found


async def until(check: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    end = time.monotonic() + timeout
    while True:
        got = await check()
        if got or time.monotonic() > end:
            return got
        await asyncio.sleep(0.1)


# ---- 1: a secret the model writes itself ----------------------------------------------------


async def test_no_secret_value_reaches_the_spool_or_the_bus(
    checkout: Checkout, a0_nats: Any
) -> None:
    with_a0_secret_extensions(checkout)
    pw, quoted = SECRETS["DB_PASS"], SECRETS["QUOTED"]
    valid = {
        "thoughts": [f"The password is in the store; I know it is {pw}."],
        "headline": f"Connecting with {pw}",
        "tool_name": "code_execution_tool",
        "tool_args": {
            "runtime": "terminal",
            "code": "psql -W §§secret(DB_PASS) -c 'select 1'",
            "note": f"or literally {pw}",
        },
    }
    malformed = f"I will just try {pw} and {quoted} by hand {{ not json"
    dirty = (  # a trailing comma: Agent Zero's parser takes it; the value JSON-escaped
        '{"thoughts": ["the other one is ' + json.dumps(quoted)[1:-1] + '",],'
        ' "tool_name": "response", "tool_args": {"text": "done with ' + pw + '",},}'
    )
    rec = monologue(
        "a0-secrets",
        f"Check the database; log in with {pw}.",
        [
            step(valid, f"connected as admin with {pw}\n(1 row)"),
            step(malformed),
            step(dirty, f"done with {pw}", True),
        ],
    )
    # NATS away first: what waits in the spool must be masked already
    checkout.write_config(nats_url=f"nats://127.0.0.1:{free_port()}", publish_timeout_s=0.5)
    agent, got = await checkout.run(rec)
    assert got == "done with §§secret(DB_PASS)"  # Agent Zero's own mask ran on the answer
    assert pw in checkout.driver.tool_args_seen[0]["code"]
    spooled = "".join(p.read_text() for p in checkout.spool_dir.glob("*.event"))
    assert spooled and leaks(spooled) == []
    # NATS back: `agentrl agent-zero flush` publishes what waited
    checkout.write_config(nats_url=a0_nats.url)
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = await asyncio.to_thread(
        CliRunner().invoke, app, ["agent-zero", "flush", str(checkout.root)]
    )
    assert out.exit_code == 0, out.output
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    assert leaks(json.dumps(payload)) == []
    t1, t2, t3 = payload["turns"]
    assert t1["thought_process"] == [
        "The password is in the store; I know it is §§secret(DB_PASS)."
    ]
    assert t1["action"]["headline"] == "Connecting with §§secret(DB_PASS)"
    assert t1["action"]["tool_args"]["code"] == "psql -W §§secret(DB_PASS) -c 'select 1'"
    assert t1["action"]["tool_args"]["note"] == "or literally §§secret(DB_PASS)"
    assert "§§secret(DB_PASS)" in t1["result"]["output"]
    assert "§§secret(DB_PASS)" in t2["observation"]["content"]
    assert "parse_error" in t2["action"] and "§§secret(QUOTED)" in t2["action"]["raw_response"]
    assert t3["thought_process"] == ["the other one is §§secret(QUOTED)"]
    assert "§§secret(DB_PASS)" in payload["task_context"]["instructions"]


# ---- 2: a project's opt-out, whatever the agent's profile -------------------------------------


def make_project(root: Path, name: str) -> Path:
    """A project as Agent Zero creates one (helpers/projects.py: usr/projects/<name>/ with
    .a0proj/project.json), its plugin settings saved as its settings screen saves them
    (save_plugin_config(plugin, project_name, agent_profile=""): .a0proj/plugins/...)."""
    meta = root / "usr" / "projects" / name / ".a0proj"
    for sub in ("instructions", "knowledge"):
        (meta / sub).mkdir(parents=True, exist_ok=True)
    (meta / "project.json").write_text(json.dumps({"title": name, "description": ""}))
    return meta


async def test_a_projects_opt_out_wins_over_the_agents_profile(
    checkout: Checkout, a0_nats: Any
) -> None:
    import helpers.plugins as a0_plugins  # the stand-in, as Agent Zero resolves settings

    meta = make_project(checkout.root, "private")
    saved = meta / "plugins" / "agentrl" / "config.json"
    saved.parent.mkdir(parents=True)
    saved.write_text(json.dumps({"opt_out": True}))
    rec = recording("subordinate_call")  # agent0 and a "developer" subordinate
    inside = checkout.agent(rec)
    inside.context.set_data("project", "private")
    # Agent Zero itself passes the agent's profile ("agent0") and misses the project's file
    assert a0_plugins.get_plugin_config("agentrl", agent=inside).get("opt_out") is not True
    _, got = await checkout.run(rec, inside)
    assert got is not None
    outside, _ = await checkout.run(rec)
    assert await trajectories_of(a0_nats.url, inside.context.id) == []
    assert len(await trajectories_of(a0_nats.url, outside.context.id)) == 2
    # the project's thumbs are refused too
    from agentrl.integrations.agent_zero.feedback import feedback_from_ui

    plugin_file = str(checkout.plugin_dir / "api" / "feedback.py")
    got_ui = await feedback_from_ui(inside.context, "thumbs_up", None, None, plugin_file)
    assert got_ui["ok"] is False and "opted out" in got_ui["message"]
    # a profile's own settings within the project come first, as in Agent Zero
    per_profile = meta / "agents" / "agent0" / "plugins" / "agentrl" / "config.json"
    per_profile.parent.mkdir(parents=True)
    per_profile.write_text(json.dumps({"opt_out": False, "domain": "coding"}))
    again = checkout.agent(rec)
    again.context.set_data("project", "private")
    await checkout.run(rec, again)
    got_main = [
        p
        for p in await trajectories_of(a0_nats.url, again.context.id)
        if p["agent_id"] == "agent-zero-main"
    ]
    assert len(got_main) == 1 and got_main[0]["task_context"]["domain"] == "coding"


# ---- 3: a reset chat is published within seconds --------------------------------------------


async def test_a_reset_from_a_short_lived_loop_is_published_within_seconds(
    checkout: Checkout, a0_nats: Any
) -> None:
    ask = {"thoughts": ["Run it."], "headline": "Running", "tool_name": "code_execution_tool"}
    iterations = [
        step({**ask, "tool_args": {"runtime": "terminal", "code": "echo hi"}}, "hi\n"),
        step({**ask, "tool_args": {"runtime": "terminal", "code": "sleep 600"}}, blocks=True),
        answer("never"),
    ]
    point = "_functions/agent/AgentContext/kill_process/start"
    for how in ("a request's own loop", "no loop at all"):
        checkout.driver.tool_args_seen.clear()
        rec = monologue(f"a0-reset-{how[:2]}", "Run a long job.", iterations)
        agent = checkout.agent(rec)
        task = asyncio.create_task(checkout.driver.monologue(agent, rec["iterations"]))
        while len(checkout.driver.tool_args_seen) < 2:
            await asyncio.sleep(0.01)
        data = {"args": (agent.context,), "kwargs": {}, "result": None, "exception": None}

        def reset(how: str = how, data: dict[str, Any] = data) -> None:
            """The web server's request handler: a sync call on its own short-lived loop
            (asyncio.run ends it, and any task it started, right after), or on none."""
            if how == "no loop at all":
                checkout.extensions.call_sync(point, None, data=data)
                return

            async def request() -> None:
                checkout.extensions.call_sync(point, None, data=data)

            asyncio.run(request())

        thread = threading.Thread(target=reset)
        thread.start()
        await asyncio.to_thread(thread.join)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        started = time.monotonic()
        session = agent.context.id
        found = await until(lambda s=session: trajectories_of(a0_nats.url, s), 10.0)
        assert found, f"not published within 10 s ({how})"
        assert time.monotonic() - started < 10.0
        (payload,) = found
        assert payload["metadata"]["abandoned"] == "killed"

        async def drained() -> bool:
            return not list(checkout.spool_dir.glob("*.event"))

        assert await until(drained, 10.0)  # the abandoned feedback went too


# ---- 5: the model that answered ---------------------------------------------------------------


async def test_another_endpoint_records_the_model_that_answered(
    checkout: Checkout, a0_nats: Any, monkeypatch: Any
) -> None:
    """Agent Zero's chat model set to another endpoint (LiteLLM provider "openrouter", model
    "meta-llama/llama-3.3-70b"), whose early-closed streams LiteLLM never reports."""
    from agentrl.integrations.agent_zero import capture

    monkeypatch.setattr(capture, "ensure_litellm_callback", lambda: True)
    rec = recording("main_with_tools")
    for it in rec["iterations"]:
        it.pop("served")  # nothing reported: the stream was closed at the first JSON

    def factory(iteration: dict[str, Any], api_base: str) -> ChatModel:
        return ChatModel(
            iteration, "https://openrouter.ai/api/v1", "meta-llama/llama-3.3-70b", "openrouter"
        )

    checkout.driver.model_factory = factory
    agent, _ = await checkout.run(rec)
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    assert [t["action"]["model"] for t in payload["turns"]] == ["meta-llama/llama-3.3-70b"] * 2
    assert payload["metadata"]["model"] == "meta-llama/llama-3.3-70b"
    # what the endpoint names, when it does (LiteLLM's report), wins over the setting
    rec = recording("main_with_tools")
    rec["iterations"][1]["served"]["model"] = "meta-llama/llama-3.3-70b-instruct:free"
    rec["iterations"][0].pop("served")
    agent, _ = await checkout.run(rec)
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    assert [t["action"]["model"] for t in payload["turns"]] == [
        "meta-llama/llama-3.3-70b",
        "meta-llama/llama-3.3-70b-instruct:free",
    ]
    assert payload["metadata"]["model"] == "meta-llama/llama-3.3-70b-instruct:free"


# ---- issue 52 item 3: a thumbs-down's correction ---------------------------------------------

NODE_DRIVER = """
import { pathToFileURL } from "node:url";
const src = process.argv[2];
globalThis.sent = [];
globalThis.getContext = () => "CTX";
const mod = await import(pathToFileURL(src).href);
class Node {
  constructor(tag) { this.tag = tag; this.children = []; this.listeners = {}; this.value = "";
    this.classList = { add() {} }; this.style = {}; }
  addEventListener(kind, fn) { this.listeners[kind] = fn; }
  appendChild(c) { this.children.push(c); }
  after(c) { globalThis.box = c; }
  remove() { globalThis.removed = true; }
  focus() {}
  querySelector() { return null; }
}
globalThis.document = { createElement: (tag) => new Node(tag) };
const bar = new Node("div");
const element = { querySelectorAll: () => [bar] };
await mod.default({ results: [{ args: { no: 7, type: "response" }, result: { element } }] });
const [up, down] = bar.children;
const pending = down.handler();            // thumbs-down: the box opens
globalThis.box.value = process.argv[3];
globalThis.box.listeners.keydown({ key: "Enter" });
await pending;
await up.handler();                        // thumbs-up: no box
console.log(JSON.stringify(globalThis.sent));
"""

NODE_STUBS = {
    "simple-action-buttons.js": (
        "export function createActionButton(icon, title, handler) {"
        " return { icon, title, handler, classList: { add() {} } }; }"
    ),
    "api.js": (
        "export async function callJsonApi(url, payload) {"
        " globalThis.sent.push({ url, payload }); return { ok: true }; }"
    ),
}


async def test_a_thumbs_down_sends_the_users_correction(
    checkout: Checkout, a0_nats: Any, tmp_path: Path
) -> None:
    import shutil
    import subprocess

    js = next((checkout.plugin_dir / "extensions" / "webui").rglob("agentrl-thumbs.js"))
    text = js.read_text()
    assert "what should it have done?" in text
    correction = "read the CSV first, then sum the second column"
    node = shutil.which("node")
    if node is not None:  # the web UI script itself, with the two Agent Zero imports stubbed
        for name, stub in NODE_STUBS.items():
            (tmp_path / name).write_text(stub)
        text = text.replace(
            "/components/messages/action-buttons/simple-action-buttons.js",
            "./simple-action-buttons.js",
        ).replace("/js/api.js", "./api.js")
        (tmp_path / "thumbs.mjs").write_text(text)
        (tmp_path / "drive.mjs").write_text(NODE_DRIVER)
        done = await asyncio.to_thread(
            subprocess.run,
            [node, str(tmp_path / "drive.mjs"), str(tmp_path / "thumbs.mjs"), correction],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        down, up = json.loads(done.stdout)
        assert down == {
            "url": "/plugins/agentrl/feedback",
            "payload": {
                "context": "CTX",
                "log_no": 7,
                "kind": "thumbs_down",
                "correction": correction,
            },
        }
        assert "correction" not in up["payload"] and up["payload"]["kind"] == "thumbs_up"
        sent = down["payload"]
    else:
        sent = {"log_no": 7, "kind": "thumbs_down", "correction": correction}
    # what the web UI sent, through the plugin's API handler, onto the bus
    import agent as a0_agent  # the stand-in of Agent Zero's agent module

    with_a0_secret_extensions(checkout)
    rec = recording("main_with_tools")
    agent_, _ = await checkout.run(rec)
    a0_agent.AgentContext._contexts[agent_.context.id] = agent_.context
    (traj,) = await trajectories_of(a0_nats.url, agent_.context.id)
    handler = import_file(checkout.plugin_dir / "api" / "feedback.py").Feedback(None, None)
    secret_note = f"{correction} (the key is {SECRETS['DB_PASS']})"
    got = await handler.process(
        {**sent, "context": agent_.context.id, "correction": secret_note}, None
    )
    assert got["ok"] is True and got["trajectory_id"] == traj["trajectory_id"]
    (event,) = [
        f
        for f in await stream_payloads(a0_nats.url, "agent.rl.feedback.v1")
        if f["trajectory_id"] == traj["trajectory_id"]
    ]
    assert event["type"] == "thumbs_down"
    assert event["correction"] == f"{correction} (the key is §§secret(DB_PASS))"


async def test_a_secret_across_the_cut_of_a_long_answer_leaves_no_half(
    checkout: Checkout, a0_nats: Any
) -> None:
    """A tool's answer over `max_text_bytes` keeps its head and tail: a value straddling the
    cut must be masked before the cut, or its first half would escape the final masking."""
    with_a0_secret_extensions(checkout)
    checkout.write_config(max_text_bytes=4096)
    pw = SECRETS["DB_PASS"]
    keep = (4096 - 80) // 2  # the head the recorder keeps (recorder.truncate)
    filler = "".join(f"row {i:04d} is fine\n" for i in range(1000))  # plain text lines
    output = filler[: keep - 10] + pw + "\n" + filler
    ask = {
        "thoughts": ["Dump it."],
        "headline": "Dumping",
        "tool_name": "code_execution_tool",
        "tool_args": {"runtime": "terminal", "code": "cat dump.txt"},
    }
    # the tool's answer ends the monologue: kept (cut) as the last turn's result, recorded
    # at the plugin's tool_execute_after, before Agent Zero's own mask (ordered after it)
    rec = monologue("a0-secret-cut", "Dump the file.", [step(ask, output, True)])
    agent, _ = await checkout.run(rec)
    (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
    wire = json.dumps(payload)
    assert pw[:10] not in wire and leaks(wire) == []
    kept = payload["turns"][0]["result"]["output"]
    assert "bytes cut]" in kept and "row 0000 is fine" in kept  # the cut kept the head
    assert "§§secr" in kept  # the head ends inside the placeholder, not inside the value
