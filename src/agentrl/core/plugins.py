"""Optional imports for the parts assembled by name (CLI commands, API routers, services)."""

from __future__ import annotations

import importlib
from types import ModuleType


def optional_module(name: str) -> ModuleType | None:
    """Import `name`, or None when it (or a package above it) is not installed; an import
    error inside an installed module still raises, so a broken plugin is never hidden."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise
