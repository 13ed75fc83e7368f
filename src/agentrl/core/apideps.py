"""FastAPI dependencies every router of the control API shares.

A router reaches the bus and the settings the app was created with through these, never by
importing another service or the app that mounts it (`agentrl.app.api`).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from agentrl.core.settings import Settings


def get_bus(request: Request) -> Any:
    """FastAPI dependency: the bus the app was created with."""
    return request.app.state.bus


def get_settings_dep(request: Request) -> Settings:
    """FastAPI dependency: the settings the app was created with."""
    settings: Settings = request.app.state.settings
    return settings
