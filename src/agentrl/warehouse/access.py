"""How a process reaches the warehouse for reading: open it (a server, or the embedded chdb
when this process may own it) and make sure the schema exists, once per process."""

from __future__ import annotations

import threading
from pathlib import Path

from agentrl.core.settings import Settings
from agentrl.warehouse import schema
from agentrl.warehouse.backend import Backend, open_backend
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.queries import Analytics

_migrated: set[str] = set()
_lock = threading.Lock()


def open_migrated(settings: Settings, wsettings: WarehouseSettings | None = None) -> Backend:
    """The process-wide backend with the schema applied (raises WarehouseLocked when another
    process owns the embedded warehouse, WarehouseDown when a server is unreachable)."""
    wsettings = wsettings or WarehouseSettings()
    backend = open_backend(wsettings, Path(settings.data_dir))
    key = f"{id(backend)}:{wsettings.database}"
    with _lock:
        if key not in _migrated:
            if wsettings.migrate:
                schema.apply(backend, wsettings)
            _migrated.add(key)
    return backend


def analytics(settings: Settings, wsettings: WarehouseSettings | None = None) -> Analytics:
    wsettings = wsettings or WarehouseSettings()
    return Analytics(open_migrated(settings, wsettings), wsettings.database)
