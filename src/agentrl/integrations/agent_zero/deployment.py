"""The deployment listener: Agent Zero follows `agent.rl.model.deployed.v1` (seed 000,
"Agent Zero Model Reload").

When Agent Zero's chat model talks to agentrl's gateway (its api_base is the plugin's
`gateway_url`, or the event's endpoint), it stays on the gateway's public name whatever is
deployed: the gateway routes that name to the live version(s) (canary steps, blue-green,
rollbacks) and names the serving version in every answer. A name pinned to a version earlier
is put back to the public name. Only an Agent Zero that calls some other endpoint is switched
to the deployed name, and only when that version takes all the traffic (weight 100) and the
event is not a rollback (a rollback's target is the old version: pinning to it would keep
Agent Zero off every later release). The chat model setting is rewritten where this Agent
Zero keeps it:
  upstream (2026):  usr/plugins/_model_config/config.json  `chat_model.name` (created from the
                    _model_config plugin's default_config.yaml when absent)
  older checkouts:  usr/settings.json  `chat_model_name`
Agent Zero reads these when it builds the next chat model, so the next monologue uses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from agentrl.contracts.deployment import ModelDeployed

log = logging.getLogger("agentrl.agent_zero")


class ModelSwitcher:
    """Reads and writes the chat model name of the Agent Zero checkout at `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.plugin_config = self.root / "usr" / "plugins" / "_model_config" / "config.json"
        self.plugin_default = self.root / "plugins" / "_model_config" / "default_config.yaml"
        self.legacy = self.root / "usr" / "settings.json"

    def _legacy_settings(self) -> dict[str, Any] | None:
        if self.legacy.is_file():
            data = json.loads(self.legacy.read_text() or "{}")
            if isinstance(data, dict) and "chat_model_name" in data:
                return data
        return None

    def api_base(self) -> str | None:
        """The chat model's API base (where Agent Zero sends its chat calls)."""
        if self.plugin_config.is_file():
            data = json.loads(self.plugin_config.read_text()).get("chat_model", {})
            return data.get("api_base") or None
        legacy = self._legacy_settings()
        if legacy is not None:
            return legacy.get("chat_model_api_base") or None
        if self.plugin_default.is_file():
            data = (yaml.safe_load(self.plugin_default.read_text()) or {}).get("chat_model", {})
            return data.get("api_base") or None
        return None

    def current(self) -> str | None:
        if self.plugin_config.is_file():
            return json.loads(self.plugin_config.read_text()).get("chat_model", {}).get("name")
        legacy = self._legacy_settings()
        if legacy is not None:
            return str(legacy["chat_model_name"])
        if self.plugin_default.is_file():
            return (
                (yaml.safe_load(self.plugin_default.read_text()) or {})
                .get("chat_model", {})
                .get("name")
            )
        return None

    def switch(self, model_name: str) -> Path:
        """Point the chat model at `model_name`; returns the file written."""
        if self.plugin_config.is_file() or (
            self.plugin_default.is_file() and self._legacy_settings() is None
        ):
            if self.plugin_config.is_file():
                config = json.loads(self.plugin_config.read_text())
            else:
                config = yaml.safe_load(self.plugin_default.read_text()) or {}
            config.setdefault("chat_model", {})["name"] = model_name
            _write_json(self.plugin_config, config)
            return self.plugin_config
        legacy = self._legacy_settings()
        if legacy is not None:
            legacy["chat_model_name"] = model_name
            _write_json(self.legacy, legacy)
            return self.legacy
        raise FileNotFoundError(
            f"no Agent Zero chat model settings under {self.root} (looked for "
            f"{self.plugin_config}, {self.plugin_default} and {self.legacy})"
        )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def as_deployment(msg: Any) -> ModelDeployed:
    """A deployment event from an event, a dict, JSON bytes or a NATS message."""
    if isinstance(msg, ModelDeployed):
        return msg
    data = getattr(msg, "data", msg)
    if isinstance(data, bytes | str):
        return ModelDeployed.model_validate_json(data)
    return ModelDeployed.model_validate(data)


def _same_base(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or b.startswith(a + "/")  # b may be the full endpoint (.../chat/completions)


def _meta(deployment: ModelDeployed, key: str) -> Any:
    return (deployment.metadata.model_extra or {}).get(key)


async def handle_model_deployment(
    msg: Any,
    switcher: ModelSwitcher,
    public_name: str = "agentrl-policy",
    gateway_url: str | None = None,
) -> str | None:
    """React to one deployment: the model name switched to, or None (nothing changes)."""
    deployment = as_deployment(msg)
    config = deployment.deployment_config
    model_id = deployment.model_info.model_id
    public = str(_meta(deployment, "public_model") or public_name)
    if public != public_name:  # another lineage's rollout: the gateway routes its agents
        log.info(
            "agentrl: %s of %s belongs to lineage %s; Agent Zero stays on %s",
            _meta(deployment, "action") or config.rollout_strategy,
            model_id,
            public,
            public_name,
        )
        return None
    api_base = await asyncio.to_thread(switcher.api_base)
    if _same_base(api_base, gateway_url) or _same_base(api_base, config.endpoint):
        current = await asyncio.to_thread(switcher.current)
        if current == public:
            log.info(
                "agentrl: %s of %s (%s%%): Agent Zero stays on %s, the gateway routes",
                _meta(deployment, "action") or config.rollout_strategy,
                model_id,
                config.traffic_percentage,
                public,
            )
            return None
        path = await asyncio.to_thread(switcher.switch, public)
        log.info("agentrl: chat model %s -> the public name %s (%s)", current, public, path)
        return public
    if config.rollout_strategy == "canary" or config.traffic_percentage < 100:
        log.info(
            "agentrl: model %s serves %s%% of %s (%s); Agent Zero keeps its model",
            model_id,
            config.traffic_percentage,
            config.model_name,
            config.rollout_strategy,
        )
        return None
    if _meta(deployment, "action") == "rollback":
        log.info("agentrl: rollback to %s: Agent Zero is never pinned on a rollback", model_id)
        return None
    name = config.model_name or model_id
    path = await asyncio.to_thread(switcher.switch, name)
    log.info(
        "agentrl: %s rollout of %s: chat model -> %s (%s)",
        config.rollout_strategy,
        model_id,
        name,
        path,
    )
    return name


async def listen(
    bus: Any,
    switcher: ModelSwitcher,
    stop: asyncio.Event,
    durable: str,
    public_name: str = "agentrl-policy",
    gateway_url: str | None = None,
) -> None:
    """Follow deployments until `stop` (a durable consumer: none is missed while away)."""

    async def handler(event: Any) -> None:
        await handle_model_deployment(event, switcher, public_name, gateway_url)

    await bus.consume(ModelDeployed.SUBJECT, durable, handler, stop=stop)
