"""The plugin's per-process state: its settings (re-read when a settings file changes), one
outbox per spool, and the keys it keeps in Agent Zero's context data. Shared by `hooks` (the
extension points) and `feedback` (the thumbs), so neither imports the other's internals."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from agentrl.integrations.agent_zero.config import (
    PLUGIN_NAME,
    AgentZeroConfig,
    load_config,
    plugin_dir_for,
    project_config,
)
from agentrl.integrations.agent_zero.publisher import Outbox

log = logging.getLogger("agentrl.agent_zero")


LAST_TRAJECTORY_KEY = "_agentrl_last_trajectory_id"


SPANS_KEY = "_agentrl_spans"  # the chat's main monologues: [first log no, last, trajectory id]


_configs: dict[str, AgentZeroConfig] = {}


_stamps: dict[str, tuple[float, ...]] = {}


_outboxes: dict[str, Outbox] = {}


def _stamp(plugin_dir: str) -> tuple[float, ...]:
    """When the settings files last changed (Agent Zero's settings screen saves config.json)."""
    if not plugin_dir:
        return ()
    out = []
    for name in ("default_config.yaml", "config.json"):
        try:
            out.append((Path(plugin_dir) / name).stat().st_mtime)
        except OSError:
            out.append(0.0)
    return tuple(out)


def config_for(plugin_file: str | Path, agent: Any = None) -> AgentZeroConfig:
    """The plugin's settings, re-read when a settings file changed; with `agent`, its
    chat's: the chat's project's own settings when it has them (whatever the agent's
    profile), else what Agent Zero's plugin-config path gives it."""
    key = str(plugin_dir_for(plugin_file) or "")
    stamp = _stamp(key)
    cached = _configs.get(key)
    if cached is None or _stamps.get(key) != stamp:
        cached = _configs[key] = load_config(Path(key) if key else None)
        _stamps[key] = stamp
    if agent is None:
        return cached
    saved = _project_settings(agent, cached)
    if saved is None:
        saved = _a0_plugin_config(agent)
    if saved is None:
        return cached
    fresh = load_config(Path(key) if key else None, saved=saved)
    return cached if fresh == cached else fresh


PROJECT_KEY = "project"  # helpers/projects.py CONTEXT_DATA_KEY_PROJECT


def project_of(agent: Any) -> str | None:
    """The project the agent's chat is in (Agent Zero keeps its name in the context data)."""
    get = getattr(getattr(agent, "context", None), "get_data", None)
    try:
        name = get(PROJECT_KEY) if callable(get) else None
    except Exception:
        return None
    return str(name) if isinstance(name, str) and name else None


def _project_settings(agent: Any, config: AgentZeroConfig) -> dict[str, Any] | None:
    project = project_of(agent)
    if project is None:
        return None
    profile = str(getattr(getattr(agent, "config", None), "profile", "") or "")
    return project_config(config.root(), project, profile)


def _a0_plugin_config(agent: Any) -> dict[str, Any] | None:
    """Agent Zero's `get_plugin_config("agentrl", agent=...)`, None outside Agent Zero."""
    try:
        plugins = importlib.import_module("helpers.plugins")
    except ImportError:
        return None
    try:
        got = plugins.get_plugin_config(PLUGIN_NAME, agent=agent)
    except Exception:  # Agent Zero's loader failed: the plugin's own files still work
        log.warning("agentrl: Agent Zero's get_plugin_config failed", exc_info=True)
        return None
    return dict(got) if isinstance(got, dict) else None


def outbox_for(config: AgentZeroConfig) -> Outbox:
    key = str(config.spool_path())
    box = _outboxes.get(key)
    if box is None:
        box = _outboxes[key] = Outbox(config)
    elif box.config != config:  # new settings (e.g. another NATS URL): keep the pause state
        box.config = config
        box.streams_ready = False
    return box


def reset_caches() -> None:
    """Forget loaded configs and outboxes (tests)."""
    _configs.clear()
    _stamps.clear()
    _outboxes.clear()
