"""The deployment listener: Agent Zero follows `agent.rl.model.deployed.v1` (seed 000,
"Agent Zero Model Reload").

`rollout_strategy` canary: nothing to do here, the gateway splits the traffic of the public
name. Any other strategy (immediate, blue_green): switch Agent Zero's chat model to the
deployed name (`deployment_config.model_name`, which agentrl's gateway serves directly), by
rewriting the chat model setting where this Agent Zero keeps it:
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


async def handle_model_deployment(msg: Any, switcher: ModelSwitcher) -> str | None:
    """React to one deployment: the model name switched to, or None (canary: nothing)."""
    deployment = as_deployment(msg)
    config = deployment.deployment_config
    model_id = deployment.model_info.model_id
    if config.rollout_strategy == "canary":
        log.info(
            "agentrl: model %s deployed with a canary rollout (%s%% of %s); the gateway "
            "routes the traffic, Agent Zero keeps its model",
            model_id,
            config.traffic_percentage,
            config.model_name,
        )
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


async def listen(bus: Any, switcher: ModelSwitcher, stop: asyncio.Event, durable: str) -> None:
    """Follow deployments until `stop` (a durable consumer: none is missed while away)."""

    async def handler(event: Any) -> None:
        await handle_model_deployment(event, switcher)

    await bus.consume(ModelDeployed.SUBJECT, durable, handler, stop=stop)
