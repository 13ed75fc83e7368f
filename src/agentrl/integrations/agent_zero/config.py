"""The plugin's settings, in layers (later wins):

1. `default_config.yaml` of the plugin;
2. Agent Zero's override convention, `A0_SET_agentrl__<key>` (environment or its .env);
3. the `config.json` Agent Zero's settings screen (`webui/config.html`) saves: read through
   Agent Zero's own plugin-config path (`helpers.plugins.get_plugin_config`) when the
   plugin runs inside Agent Zero, so a chat in a project gets the project's settings
   (`usr/projects/<p>/.a0proj/plugins/agentrl/config.json`, e.g. a per-project opt_out);
   else the global one next to `plugin.yaml`;
4. AGENTRL_A0_<KEY> variables.

The same files are read in every layout (upstream `usr/plugins/agentrl/`, or the older
`python/extensions/` layout, where `agentrl agent-zero install` puts them under
`usr/plugins/agentrl/` as well), so a setting means the same wherever the plugin runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

PLUGIN_NAME = "agentrl"
ENV_PREFIX = "AGENTRL_A0_"
A0_ENV_PREFIX = f"A0_SET_{PLUGIN_NAME}__"  # Agent Zero's: A0_SET_<plugin>__<key>


class AgentZeroConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    enabled: bool = Field(True, description="Record and publish trajectories at all.")
    opt_out: bool = Field(False, description="The user opted out of RL: publish nothing.")
    nats_url: str = "nats://127.0.0.1:4222"
    nats_token: str = ""
    gateway_url: str = "http://127.0.0.1:8700/v1"
    api_url: str = "http://127.0.0.1:8600"
    api_token: str = ""
    spool_dir: str = Field("usr/agentrl/spool", description="Relative to Agent Zero's root.")
    redact: bool = Field(True, description="Redact PII before anything leaves the agent.")
    publish_timeout_s: float = Field(
        2.0, gt=0, description="The most a monologue's end waits on NATS before spooling."
    )
    connect_timeout_s: float = Field(1.0, gt=0)
    model_name: str = Field("agentrl-policy", description="The gateway's public model name.")
    capture_wait_s: float = Field(
        0.5, ge=0, description="The most a turn waits for LiteLLM's report of the call."
    )
    domain: str = "general"
    structured_outputs: bool = Field(
        False,
        description="Ask agentrl's gateway for Agent Zero's response schema (tool_name among "
        "the agent's tools): every answer is a well-formed tool request.",
    )
    max_text_bytes: int = Field(
        32_768,
        ge=1024,
        description="A tool answer or observation is cut to this many bytes (head and tail).",
    )
    agent_zero_root: str = Field("", description="Agent Zero's folder; empty: the cwd.")

    def root(self) -> Path:
        return Path(self.agent_zero_root or os.getcwd())

    def spool_path(self) -> Path:
        p = Path(self.spool_dir)
        return p if p.is_absolute() else self.root() / p


def plugin_dir_for(file: str | Path) -> Path | None:
    """The plugin folder (the one holding plugin.yaml) of a plugin file, in either layout."""
    here = Path(file).resolve()
    for parent in here.parents:
        if (parent / "plugin.yaml").is_file():
            return parent
        legacy = parent / "usr" / "plugins" / PLUGIN_NAME
        if (legacy / "plugin.yaml").is_file():
            return legacy
    return None


def load_config(
    plugin_dir: Path | None,
    env: Mapping[str, str] | None = None,
    saved: Mapping[str, Any] | None = None,
) -> AgentZeroConfig:
    """The settings; `saved` is what Agent Zero's plugin-config path found for this chat
    (its project's config.json, or the global one), else the global file is read."""
    values: dict[str, Any] = {}
    environ: Mapping[str, str] = os.environ if env is None else env
    if plugin_dir is not None:
        default = plugin_dir / "default_config.yaml"
        if default.is_file():
            values.update(yaml.safe_load(default.read_text()) or {})
    for name in AgentZeroConfig.model_fields:
        for key in (A0_ENV_PREFIX + name, A0_ENV_PREFIX + name.upper()):
            if key in environ:
                values[name] = environ[key]
    if saved is not None:
        values.update(saved)
    elif plugin_dir is not None and (plugin_dir / "config.json").is_file():
        values.update(json.loads((plugin_dir / "config.json").read_text()) or {})
    for name in AgentZeroConfig.model_fields:
        key = ENV_PREFIX + name.upper()
        if key in environ:
            values[name] = environ[key]
    if not values.get("agent_zero_root") and plugin_dir is not None:
        values["agent_zero_root"] = str(_root_of(plugin_dir))
    return AgentZeroConfig.model_validate(values)


def _root_of(plugin_dir: Path) -> Path:
    """Agent Zero's root: the folder above `usr/plugins/agentrl`."""
    parts = plugin_dir.resolve().parts
    if len(parts) >= 3 and parts[-3:-1] == ("usr", "plugins"):
        return Path(*parts[:-3])
    return plugin_dir.parent
