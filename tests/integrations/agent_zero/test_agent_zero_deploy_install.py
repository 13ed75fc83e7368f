"""The deployment listener (immediate switches Agent Zero's chat model, canary does nothing)
and `agentrl agent-zero install` in both layouts (the legacy one driven end to end)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from a0_kit import make_agent, recording, stream_payloads, trajectories_of
from a0_standins import Driver, Extensions, install_standins, make_checkout, remove_standins
from typer.testing import CliRunner

from agentrl.bus import Bus
from agentrl.cli import app
from agentrl.contracts import ModelDeployed
from agentrl.contracts.base import new_id, utcnow
from agentrl.integrations.agent_zero import state
from agentrl.integrations.agent_zero.deployment import (
    ModelSwitcher,
    handle_model_deployment,
    listen,
)
from agentrl.integrations.agent_zero.install import install

MODEL_CONFIG_DEFAULT = {  # the shape of plugins/_model_config/default_config.yaml upstream
    "allow_chat_override": True,
    "chat_model": {"provider": "other", "name": "agentrl-policy", "api_base": "http://gw/v1"},
    "utility_model": {"provider": "openrouter", "name": "small"},
}


def deployment(
    strategy: str,
    model_id: str = "agentrl-policy-v7",
    weight: float | None = None,
    action: str | None = None,
) -> ModelDeployed:
    event = _deployment(strategy, model_id)
    if weight is not None:
        event.deployment_config.traffic_percentage = weight
    if action is not None:  # what agentrl.release.actions.build_event writes
        event.metadata = type(event.metadata).model_validate(
            {"action": action, "public_model": "agentrl-policy"}
        )
    return event


def _deployment(strategy: str, model_id: str) -> ModelDeployed:
    return ModelDeployed.model_validate(
        {
            "training_job_id": new_id(),
            "timestamp": utcnow(),
            "model_info": {"model_id": model_id, "base_model": "tiny", "checkpoint_path": "/c"},
            "deployment_config": {
                "endpoint": "http://127.0.0.1:8700/v1/chat/completions",
                "model_name": model_id,
                "rollout_strategy": strategy,
                "traffic_percentage": 100.0 if strategy == "immediate" else 10.0,
            },
            "validation_results": {
                "benchmark_passed": True,
                "safety_checks_passed": True,
                "performance_regression": False,
            },
        }
    )


def upstream_root(tmp_path: Path) -> Path:
    root = tmp_path / "a0"
    default = root / "plugins" / "_model_config" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text(yaml.safe_dump(MODEL_CONFIG_DEFAULT))
    return root


async def test_immediate_switches_the_model_canary_does_nothing(tmp_path: Path) -> None:
    root = upstream_root(tmp_path)
    switcher = ModelSwitcher(root)
    assert await handle_model_deployment(deployment("canary"), switcher) is None
    assert not switcher.plugin_config.exists()  # nothing written
    assert switcher.current() == "agentrl-policy"

    name = await handle_model_deployment(deployment("immediate").to_json(), switcher)
    assert name == "agentrl-policy-v7"
    saved = json.loads(switcher.plugin_config.read_text())
    assert saved["chat_model"]["name"] == "agentrl-policy-v7"
    assert saved["chat_model"]["api_base"] == "http://gw/v1"  # the rest kept
    assert saved["utility_model"] == MODEL_CONFIG_DEFAULT["utility_model"]

    await handle_model_deployment(deployment("canary", "agentrl-policy-v8"), switcher)
    assert switcher.current() == "agentrl-policy-v7"


GATEWAY = "http://127.0.0.1:8700/v1"


async def test_on_agentrls_gateway_agent_zero_stays_on_the_public_name(tmp_path: Path) -> None:
    """Talking to agentrl's gateway, Agent Zero keeps the public name through every rollout
    step and rollback (the gateway routes it); a version pinned earlier is un-pinned."""
    root = upstream_root(tmp_path)
    switcher = ModelSwitcher(root)
    switcher.switch("agentrl-policy")
    config = json.loads(switcher.plugin_config.read_text())
    config["chat_model"]["api_base"] = GATEWAY + "/"
    switcher.plugin_config.write_text(json.dumps(config))
    steps = [
        deployment("blue_green", "agentrl-policy-v8", weight=0.0, action="rollout"),
        deployment("blue_green", "agentrl-policy-v8", weight=100.0, action="promote"),
        deployment("immediate", "agentrl-policy-base", weight=100.0, action="rollback"),
        deployment("canary", "agentrl-policy-v9", weight=10.0, action="rollout"),
    ]
    for event in steps:
        assert await handle_model_deployment(event, switcher, "agentrl-policy", GATEWAY) is None
        assert switcher.current() == "agentrl-policy"
    switcher.switch("agentrl-policy-v3")  # pinned by an older listener
    rollback = deployment("immediate", "agentrl-policy-base", weight=100.0, action="rollback")
    assert await handle_model_deployment(rollback, switcher, "agentrl-policy", GATEWAY) == (
        "agentrl-policy"
    )
    assert switcher.current() == "agentrl-policy"
    # the event's endpoint names the gateway too (no gateway_url given)
    switcher.switch("agentrl-policy-v3")
    assert await handle_model_deployment(steps[1], switcher) == "agentrl-policy"


async def test_another_lineages_rollout_never_switches_agent_zero(tmp_path: Path) -> None:
    """Lineages: a promote in lineage `agent0/research` (the gateway sends the researcher
    profile there) leaves Agent Zero's model on the name it asks for, on the gateway or not."""
    root = upstream_root(tmp_path)
    switcher = ModelSwitcher(root)
    switcher.switch("agentrl-policy")
    other = deployment("immediate", "agent0/research-v2", weight=100.0, action="promote")
    other.metadata = type(other.metadata).model_validate(
        {"action": "promote", "public_model": "agent0/research"}
    )
    assert await handle_model_deployment(other, switcher, "agentrl-policy", GATEWAY) is None
    assert switcher.current() == "agentrl-policy"
    config = json.loads(switcher.plugin_config.read_text())
    config["chat_model"]["api_base"] = GATEWAY + "/"
    switcher.plugin_config.write_text(json.dumps(config))
    assert await handle_model_deployment(other, switcher, "agentrl-policy", GATEWAY) is None
    assert switcher.current() == "agentrl-policy"


async def test_elsewhere_only_a_full_weight_non_rollback_switches(tmp_path: Path) -> None:
    root = upstream_root(tmp_path)  # api_base http://gw/v1: not agentrl's gateway
    switcher = ModelSwitcher(root)
    warm = deployment("blue_green", "agentrl-policy-v8", weight=0.0, action="rollout")
    assert await handle_model_deployment(warm, switcher, "agentrl-policy", GATEWAY) is None
    back = deployment("immediate", "agentrl-policy-base", weight=100.0, action="rollback")
    assert await handle_model_deployment(back, switcher, "agentrl-policy", GATEWAY) is None
    assert switcher.current() == "agentrl-policy"
    full = deployment("blue_green", "agentrl-policy-v8", weight=100.0, action="promote")
    assert await handle_model_deployment(full, switcher, "agentrl-policy", GATEWAY) == (
        "agentrl-policy-v8"
    )
    assert switcher.current() == "agentrl-policy-v8"


async def test_legacy_settings_json_is_switched(tmp_path: Path) -> None:
    settings = tmp_path / "a0" / "usr" / "settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"chat_model_name": "old", "chat_model_api_base": "x"}))
    switcher = ModelSwitcher(tmp_path / "a0")
    await handle_model_deployment(deployment("immediate"), switcher)
    saved = json.loads(settings.read_text())
    assert saved == {"chat_model_name": "agentrl-policy-v7", "chat_model_api_base": "x"}
    with pytest.raises(FileNotFoundError, match="no Agent Zero chat model settings"):
        ModelSwitcher(tmp_path / "nothing").switch("m")


async def test_listener_follows_deployments_on_nats(tmp_path: Path, a0_nats: Any) -> None:
    root = upstream_root(tmp_path)
    switcher = ModelSwitcher(root)
    bus = await Bus.connect(a0_nats.url)
    try:
        await bus.ensure_streams()
        stop = asyncio.Event()
        task = asyncio.create_task(listen(bus, switcher, stop, f"a0-{new_id()[:8]}"))
        await bus.publish(deployment("canary", "v-canary"))
        await bus.publish(deployment("immediate", "v-now"))
        for _ in range(100):
            if switcher.current() == "v-now":
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(task, 10)
        assert switcher.current() == "v-now"
    finally:
        await bus.close()


def test_install_plugin_layout_keeps_saved_settings(tmp_path: Path) -> None:
    root = make_checkout(tmp_path / "a0")
    saved = root / "usr" / "plugins" / "agentrl" / "config.json"
    saved.parent.mkdir(parents=True)
    saved.write_text('{"nats_url": "nats://mine:4222"}')
    result = CliRunner().invoke(app, ["agent-zero", "install", str(root), "--no-client"])
    assert result.exit_code == 0, result.output
    assert (
        "plugin layout" in result.output and "api_base: http://127.0.0.1:8700/v1" in result.output
    )
    plugin = root / "usr" / "plugins" / "agentrl"
    for rel in (
        "plugin.yaml",
        "default_config.yaml",
        "extensions/python/monologue_end/_80_agentrl_trajectory.py",
        "extensions/python/tool_execute_after/_80_agentrl_trajectory.py",
        "tools/rl_training.py",
        "prompts/agent.system.tool.rl_training.md",
        "agents/rl-trainer/agent.yaml",
    ):
        assert (plugin / rel).is_file(), rel
    meta = yaml.safe_load((plugin / "plugin.yaml").read_text())
    assert {"name", "title", "description", "version", "settings_sections"} <= set(meta)
    assert saved.read_text() == '{"nats_url": "nats://mine:4222"}'  # never overwritten
    bad = CliRunner().invoke(app, ["agent-zero", "install", str(tmp_path / "empty")])
    assert bad.exit_code == 2 and "not an Agent Zero checkout" in bad.output


async def test_legacy_layout_end_to_end(tmp_path: Path, a0_nats: Any) -> None:
    """Older checkouts and forks: python/extensions/<point>/ and python.helpers.extension."""
    root = make_checkout(tmp_path / "a0-legacy", legacy=True)
    done = install(root)
    assert done.layout == "legacy"
    assert (root / "python" / "tools" / "rl_training.py").is_file()
    assert (root / "prompts" / "agent.system.tool.rl_training.md").is_file()
    assert (root / "agents" / "rl-trainer" / "_context.md").is_file()
    (done.plugin_dir / "config.json").write_text(json.dumps({"nats_url": a0_nats.url}))
    install_standins(root)  # only python/helpers exists: the shims fall back to it
    state.reset_caches()
    try:
        from python.helpers.extension import Extension  # type: ignore[import-not-found]

        with pytest.raises(ImportError):
            import helpers.extension  # type: ignore[import-not-found]  # noqa: F401
        ext = Extensions([root / "python" / "extensions"], package="python.helpers")
        assert all(issubclass(c, Extension) for cs in ext.by_point.values() for c in cs)
        rec = recording("main_with_tools")
        agent = make_agent(rec)
        answer = await Driver(ext).monologue(agent, rec["iterations"])
        assert answer == "The sum of [1, 2, 3] is 6."
        (payload,) = await trajectories_of(a0_nats.url, agent.context.id)
        assert [t["action"]["tool_name"] for t in payload["turns"]] == [
            "code_execution_tool",
            "response",
        ]
    finally:
        remove_standins(root)
        import sys

        for name in [m for m in sys.modules if m == "python" or m.startswith("python.")]:
            del sys.modules[name]
        state.reset_caches()


def test_feedback_and_flush_commands(tmp_path: Path, a0_nats: Any) -> None:
    """`feedback` spools while NATS is unreachable; `flush` delivers once NATS is there."""
    import asyncio as aio

    from agentrl.bus.server import free_port

    root = make_checkout(tmp_path / "a0")
    install(root)
    config = root / "usr" / "plugins" / "agentrl" / "config.json"
    down = f"nats://127.0.0.1:{free_port()}"
    config.write_text(json.dumps({"nats_url": down, "publish_timeout_s": 1.0}))
    state.reset_caches()
    tid = new_id()
    runner = CliRunner()
    bad = runner.invoke(app, ["agent-zero", "feedback", str(root), tid, "rating"])
    assert bad.exit_code != 0 and "rating" in bad.output  # a rating needs --rating
    out = runner.invoke(app, ["agent-zero", "feedback", str(root), tid, "rating", "--rating", "5"])
    assert out.exit_code == 0 and "spooled" in out.output, out.output
    failed = runner.invoke(app, ["agent-zero", "flush", str(root), "--timeout", "1"])
    assert failed.exit_code == 1 and "1 left" in failed.output
    config.write_text(json.dumps({"nats_url": a0_nats.url}))
    done = runner.invoke(app, ["agent-zero", "flush", str(root)])
    assert done.exit_code == 0 and "published 1 of 1" in done.output, done.output
    stored = aio.run(stream_payloads(a0_nats.url, "agent.rl.feedback.v1"))
    assert [f["rating"] for f in stored if f["trajectory_id"] == tid] == [5]
