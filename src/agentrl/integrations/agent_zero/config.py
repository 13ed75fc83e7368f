"""The plugin's settings, in layers (later wins):

1. `default_config.yaml` of the plugin;
2. Agent Zero's override convention, `A0_SET_agentrl__<key>` (its environment, or its
   `usr/.env`, which Agent Zero loads at start and the CLI commands read too);
3. the `config.json` Agent Zero's settings screen (`webui/config.html`) saves. A chat in a
   project gets the project's own (`usr/projects/<p>/.a0proj/agents/<profile>/plugins/
   agentrl/config.json`, then `.../.a0proj/plugins/agentrl/config.json`), read here: Agent
   Zero's `get_plugin_config` looks at the project-wide file only when no agent profile is
   given, and it always gives one, so a project's `opt_out` was ignored. Otherwise what
   Agent Zero's plugin-config path finds (a profile's, then the global one next to
   `plugin.yaml`);
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
    usage_wait_s: float = Field(
        1.0,
        ge=0,
        description="The most a monologue's end waits for its turns' token usage from the "
        "gateway's completion log (0: do not look).",
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
        values.update(_defaults(plugin_dir))
    if env is None and plugin_dir is not None:  # Agent Zero's usr/.env wins, as it loads it
        environ = {**environ, **a0_dotenv(_root_of(plugin_dir))}
    for name in AgentZeroConfig.model_fields:
        for key in a0_env_names(name):
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


def a0_env_names(name: str) -> tuple[str, ...]:
    """The names Agent Zero reads a plugin default from (helpers/settings.get_default_value:
    A0_SET_<plugin>__<key>, then its upper-case form)."""
    return (A0_ENV_PREFIX + name, A0_ENV_PREFIX + name.upper(), f"{A0_ENV_PREFIX}{name}".upper())


def a0_dotenv(root: Path) -> dict[str, str]:
    """The `A0_SET_agentrl__*` lines of Agent Zero's `usr/.env` (KEY=VALUE, quotes off)."""
    path = root / "usr" / ".env"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export ") :].strip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key.upper().startswith(A0_ENV_PREFIX.upper()):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def project_config(root: Path, project: str, profile: str = "") -> dict[str, Any] | None:
    """A project's saved settings for this plugin: the profile's within the project, then
    the project-wide file (`usr/projects/<p>/.a0proj/...`); None when the project has none."""
    if not project or "/" in project or project in (".", ".."):
        return None
    meta = root / "usr" / "projects" / project / ".a0proj"
    candidates = []
    if profile and "/" not in profile:
        candidates.append(meta / "agents" / profile / "plugins" / PLUGIN_NAME / "config.json")
    candidates.append(meta / "plugins" / PLUGIN_NAME / "config.json")
    for path in candidates:
        if path.is_file():
            data = json.loads(path.read_text() or "{}")
            return dict(data) if isinstance(data, dict) else {}
    return None


def save_settings(plugin_dir: Path, values: Mapping[str, Any]) -> Path:
    """Merge `values` into the plugin's saved settings (`config.json`, what Agent Zero's
    settings screen edits and the plugin reads); returns the file."""
    path = plugin_dir / "config.json"
    current: dict[str, Any] = {}
    if path.is_file():
        loaded = json.loads(path.read_text() or "{}")
        current = dict(loaded) if isinstance(loaded, dict) else {}
    current.update(values)
    AgentZeroConfig.model_validate({**_defaults(plugin_dir), **current})  # a typo fails here
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(current, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def _defaults(plugin_dir: Path) -> dict[str, Any]:
    default = plugin_dir / "default_config.yaml"
    return dict(yaml.safe_load(default.read_text()) or {}) if default.is_file() else {}


def _root_of(plugin_dir: Path) -> Path:
    """Agent Zero's root: the folder above `usr/plugins/agentrl`."""
    parts = plugin_dir.resolve().parts
    if len(parts) >= 3 and parts[-3:-1] == ("usr", "plugins"):
        return Path(*parts[:-3])
    return plugin_dir.parent
