"""The plugin's settings the way Agent Zero keeps them: its plugin-config path (a project's
own config.json first), its `A0_SET_<plugin>__<key>` override convention, the settings screen
(`webui/config.html`) that edits them, and the chat model settings `install` prints."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import yaml
from a0_kit import Checkout, recording, stream_payloads, trajectories_of
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.integrations.agent_zero import hooks, state
from agentrl.integrations.agent_zero.config import AgentZeroConfig


async def test_a_projects_opt_out_is_honoured(checkout: Checkout, a0_nats: Any) -> None:
    """Agent Zero saves a project's plugin settings under the project; a chat in that
    project publishes nothing, a chat outside it still does."""
    project = checkout.root / "usr" / "projects" / "private" / ".a0proj" / "plugins" / "agentrl"
    project.mkdir(parents=True)
    global_saved = json.loads((checkout.plugin_dir / "config.json").read_text())
    (project / "config.json").write_text(json.dumps({**global_saved, "opt_out": True}))
    rec = recording("main_with_tools")
    inside = checkout.agent(rec)
    inside.context.set_data("project", "private")  # projects.CONTEXT_DATA_KEY_PROJECT
    _, got = await checkout.run(rec, inside)
    assert got is not None
    outside, _ = await checkout.run(rec)
    assert await trajectories_of(a0_nats.url, inside.context.id) == []
    assert len(await trajectories_of(a0_nats.url, outside.context.id)) == 1


def test_a0_set_overrides_apply(checkout: Checkout, monkeypatch: Any) -> None:
    """Agent Zero's convention A0_SET_agentrl__<key> sets a default; a saved setting and
    AGENTRL_A0_<KEY> still win over it."""
    (checkout.plugin_dir / "config.json").unlink()
    state.reset_caches()
    monkeypatch.setenv("A0_SET_agentrl__domain", "coding")
    monkeypatch.setenv("A0_SET_agentrl__max_text_bytes", "4096")
    shim = checkout.plugin_dir / "plugin.yaml"
    cfg = hooks.config_for(shim)
    assert cfg.domain == "coding" and cfg.max_text_bytes == 4096
    checkout.write_config(domain="research")
    assert hooks.config_for(shim).domain == "research"
    monkeypatch.setenv("AGENTRL_A0_DOMAIN", "writing")
    state.reset_caches()
    assert hooks.config_for(shim).domain == "writing"


def test_the_settings_screen_edits_every_setting(checkout: Checkout) -> None:
    html = (checkout.plugin_dir / "webui" / "config.html").read_text()
    bound = set(re.findall(r'x-model(?:\.\w+)*="config\.(\w+)"', html))
    defaults = yaml.safe_load((checkout.plugin_dir / "default_config.yaml").read_text())
    assert set(defaults) <= bound <= set(AgentZeroConfig.model_fields)
    for token in ("nats_token", "api_token"):  # never shown in clear
        assert re.search(rf'type="password"[^>]*x-model="config\.{token}"', html), token


async def test_install_saves_the_urls_it_is_given_and_asks_that_gateway(
    checkout: Checkout, tmp_path: Path, a0_nats: Any, monkeypatch: Any
) -> None:
    """Issue 51.6: the stack on other ports. `install --nats-url --gateway-url --api-url`
    saves them where the plugin reads them (its config.json), prints them (not the
    defaults) and the ctx_length of the model the gateway at that URL serves (GET /v1/models
    `max_model_len`); no "enable it in Settings > Plugins" step."""
    from test_agent_zero_gateway import serve

    from agentrl.bus.server import free_port
    from agentrl.serving.backends import LocalBackend
    from agentrl.serving.gateway import GatewayState, create_gateway_app
    from agentrl.serving.local import LocalEngine

    for name in ("NATS_URL", "AGENTRL_GATEWAY_PORT", "AGENTRL_GATEWAY_HOST", "AGENTRL_API_PORT"):
        monkeypatch.delenv(name, raising=False)
    engine = LocalEngine(
        "tiny", seed=0, tiny_kwargs={"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}
    )
    gw_state = GatewayState("agentrl-policy")
    gw_state.backends["agentrl-policy-base"] = LocalBackend(engine, tmp_path)
    gw_state.set_split({"agentrl-policy-base": 100.0}, ["agentrl-policy-base"])
    server, task, port = await serve(create_gateway_app(gw_state))
    (checkout.plugin_dir / "config.json").unlink()  # a first install
    state.reset_caches()
    gateway, api = f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{free_port()}"
    try:
        args = ["agent-zero", "install", str(checkout.root), "--no-client"]
        args += ["--nats-url", a0_nats.url, "--gateway-url", gateway, "--api-url", api]
        out = await asyncio.to_thread(CliRunner().invoke, app, args)
    finally:
        server.should_exit = True
        await task
    assert out.exit_code == 0, out.output
    assert "Settings > Plugins" not in out.output and "pip install agentrl" not in out.output
    assert ":8700" not in out.output and ":4222" not in out.output and ":8600" not in out.output
    assert a0_nats.url in out.output and api in out.output
    assert f"api_base: {gateway}" in out.output
    found = re.search(r"ctx_length:\s+(\d+)", out.output)
    assert found is not None, out.output
    assert int(found.group(1)) == engine.context
    saved = json.loads((checkout.plugin_dir / "config.json").read_text())
    assert saved == {"nats_url": a0_nats.url, "gateway_url": gateway, "api_url": api}
    cfg = hooks.config_for(checkout.plugin_dir / "plugin.yaml")  # what the plugin reads
    assert (cfg.nats_url, cfg.gateway_url, cfg.api_url) == (a0_nats.url, gateway, api)
    # installing again keeps what was saved and adds what is given
    again = ["agent-zero", "install", str(checkout.root), "--no-client", "--api-token", "t"]
    out = await asyncio.to_thread(CliRunner().invoke, app, again)
    assert out.exit_code == 0, out.output
    saved = json.loads((checkout.plugin_dir / "config.json").read_text())
    assert saved["nats_url"] == a0_nats.url and saved["api_token"] == "t"


def test_flush_and_feedback_read_agent_zeros_settings(
    checkout: Checkout, a0_nats: Any, monkeypatch: Any
) -> None:
    """`agent-zero feedback` and `flush` read the plugin's settings where Agent Zero keeps
    them (its config.json, and A0_SET_agentrl__* in its usr/.env), not this shell's."""
    from agentrl.bus.server import free_port
    from agentrl.contracts.base import new_id

    for name in ("NATS_URL", "AGENTRL_A0_NATS_URL"):
        monkeypatch.delenv(name, raising=False)
    trajectory = new_id()
    dead = f"nats://127.0.0.1:{free_port()}"
    checkout.write_config(nats_url=dead, publish_timeout_s=0.5, connect_timeout_s=0.2)
    cmd = ["agent-zero", "feedback", str(checkout.root), trajectory, "thumbs_down"]
    out = CliRunner().invoke(app, [*cmd, "--correction", "read the CSV first"])
    assert out.exit_code == 0, out.output
    assert "spooled" in out.output  # config.json's NATS (down), not a default
    # the saved file without a NATS URL: Agent Zero's usr/.env gives it
    saved = json.loads((checkout.plugin_dir / "config.json").read_text())
    saved.pop("nats_url")
    (checkout.plugin_dir / "config.json").write_text(json.dumps(saved))
    (checkout.root / "usr" / ".env").write_text(f"A0_SET_agentrl__nats_url={a0_nats.url}\n")
    state.reset_caches()
    out = CliRunner().invoke(app, ["agent-zero", "flush", str(checkout.root)])
    assert out.exit_code == 0, out.output
    assert "published 1 of 1" in out.output
    got = [
        f
        for f in asyncio.run(stream_payloads(a0_nats.url, "agent.rl.feedback.v1"))
        if f["trajectory_id"] == trajectory
    ]
    assert [(f["type"], f["correction"]) for f in got] == [("thumbs_down", "read the CSV first")]
