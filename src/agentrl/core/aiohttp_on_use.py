"""nats-py imports aiohttp as it is imported, for its WebSocket transport (ws:// URLs) only,
though agentrl speaks NATS over TCP: ~0.18 CPU-s of every agentrl process's start (20 x
`import nats` 8.97 -> 5.44 CPU-s, load 4.5, 2026-11-30). `defer()` puts a finder on
sys.meta_path that loads nats.aio.transport with a stand-in for aiohttp, which imports the
real one at its first use (a ws:// connection): nothing changes for those but when the
import happens. Where aiohttp is already imported, or a nats-py reads it while it is
imported, nats gets the real one."""

from __future__ import annotations

import importlib.machinery
import logging
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importlib.abc would import importlib.resources (tempfile, zipfile...)
    from collections.abc import Sequence
    from importlib.abc import Loader

TRANSPORT = "nats.aio.transport"
log = logging.getLogger(__name__)


class _AiohttpOnFirstUse(types.ModuleType):
    """What nats.aio.transport holds as `aiohttp` until the first attribute is read."""

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get("aiohttp") is self:  # still inside nats' own import
            raise AttributeError(name)
        import aiohttp

        transport = sys.modules.get(TRANSPORT)
        if transport is not None and getattr(transport, "aiohttp", None) is self:
            transport.aiohttp = aiohttp  # type: ignore[attr-defined]
        return getattr(aiohttp, name)


class _TransportLoader:
    """nats.aio.transport's own loader, run with the stand-in as `aiohttp`."""

    def __init__(self, real: Loader) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        if "aiohttp" in sys.modules:
            self.real.exec_module(module)
            return
        stand_in = _AiohttpOnFirstUse("aiohttp")
        sys.modules["aiohttp"] = stand_in
        try:
            self.real.exec_module(module)
            return
        except Exception:  # a nats-py that reads aiohttp as it is imported: the real one
            log.debug("nats.aio.transport needs aiohttp at import; imported it", exc_info=True)
        finally:
            if sys.modules.get("aiohttp") is stand_in:
                del sys.modules["aiohttp"]
        self.real.exec_module(module)


class _TransportFinder:
    """A sys.meta_path finder: nats.aio.transport's spec, with `_TransportLoader`."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRANSPORT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _TransportLoader(spec.loader)  # type: ignore[assignment]
        return spec


def defer() -> None:
    """Install the finder once (before nats is imported, or it has no effect)."""
    if not any(isinstance(f, _TransportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TransportFinder())
