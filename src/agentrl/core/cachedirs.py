"""Where agentrl keeps what any data dir can share: the user cache.

A converted base model or a benchmark's peer installs depend on nothing in a data dir, so
they live once per user: `$AGENTRL_CACHE_DIR`, else `$XDG_CACHE_HOME/agentrl`, else
`~/.cache/agentrl` (the XDG base-directory default). Pure path logic, no I/O.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_home(env: dict[str, str] | None = None) -> Path:
    """agentrl's user cache folder (not created here)."""
    env = dict(os.environ) if env is None else env
    if env.get("AGENTRL_CACHE_DIR"):
        return Path(env["AGENTRL_CACHE_DIR"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "agentrl"


def models_home(env: dict[str, str] | None = None) -> Path:
    """Converted base models: `$AGENTRL_MODELS_DIR`, else `<cache_home>/models`."""
    env = dict(os.environ) if env is None else env
    if env.get("AGENTRL_MODELS_DIR"):
        return Path(env["AGENTRL_MODELS_DIR"]).expanduser()
    return cache_home(env) / "models"
