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
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.integrations.agent_zero import hooks, state
from agentrl.integrations.agent_zero.config import AgentZeroConfig
from conftest import Checkout, recording, trajectories_of


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


async def test_install_prints_the_served_ctx_length_and_no_extra_steps(
    checkout: Checkout, tmp_path: Path
) -> None:
    """The ctx_length printed is the context window of the model agentrl's gateway serves
    (GET /v1/models `max_model_len`); no "enable it in Settings > Plugins" step."""
    from test_agent_zero_gateway import serve

    from agentrl.deploy.backends import LocalBackend
    from agentrl.deploy.gateway import GatewayState, create_gateway_app
    from agentrl.deploy.local import LocalEngine

    engine = LocalEngine(
        "tiny", seed=0, tiny_kwargs={"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}
    )
    state = GatewayState("agentrl-policy")
    state.backends["agentrl-policy-base"] = LocalBackend(engine, tmp_path)
    state.set_split({"agentrl-policy-base": 100.0}, ["agentrl-policy-base"])
    server, task, port = await serve(create_gateway_app(state))
    try:
        checkout.write_config(gateway_url=f"http://127.0.0.1:{port}/v1")
        args = ["agent-zero", "install", str(checkout.root), "--no-client"]
        out = await asyncio.to_thread(CliRunner().invoke, app, args)
    finally:
        server.should_exit = True
        await task
    assert out.exit_code == 0, out.output
    assert "Settings > Plugins" not in out.output and "pip install agentrl" not in out.output
    found = re.search(r"ctx_length:\s+(\d+)", out.output)
    assert found is not None, out.output
    assert int(found.group(1)) == engine.context
