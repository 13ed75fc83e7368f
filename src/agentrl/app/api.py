"""The control API (FastAPI): one app assembled from each package's router.

Routers live in their packages (`agentrl.training.api`, `agentrl.warehouse.api`,
`agentrl.release.api`, `agentrl.observability.api`), each exposing `router: APIRouter`;
this module only mounts those that are installed, like `cli.py` does for commands. A router
reaches the shared bus and settings through `request.app.state` (see `agentrl.core.apideps`),
never by importing another service.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import Depends, FastAPI, Request

from agentrl.core.plugins import optional_module
from agentrl.core.settings import Settings

log = logging.getLogger(__name__)

ROUTERS: tuple[str, ...] = (
    "agentrl.training.api",
    "agentrl.warehouse.api",
    "agentrl.release.api",
    "agentrl.observability.api",
    "agentrl.capture.api",
)


def create_app(settings: Settings, bus: Any = None) -> FastAPI:
    """The control API over `bus` (an `agentrl.bus.Bus`, or None for routes that need none).
    Every route needs a token when tokens are configured, except those on the public list
    (`agentrl.core.apiauth.PUBLIC_PATHS`): a router that forgets its scope check stays closed."""
    from agentrl.core.apiauth import require_token

    app = FastAPI(
        title="agentrl control API",
        description="Training jobs, models, feedback, warehouse statistics and metrics.",
        version="1",
        dependencies=[Depends(require_token)],
    )
    app.state.bus = bus
    app.state.settings = settings
    for name in ROUTERS:
        module = optional_module(name)
        if module is not None:
            app.include_router(module.router)

    @app.get(
        "/health",
        tags=["stack"],
        summary="Up or down; every supervised service's state to a caller with a token",
    )
    async def health(request: Request) -> dict[str, Any]:
        from agentrl.app.stack import running_stack
        from agentrl.core.apiauth import authenticated

        stack = running_stack(app.state.bus)
        services = stack.health_report() if stack else {}
        ok = all(s["healthy"] for s in services.values())
        if not authenticated(request):  # errors name hosts, paths and versions: not public
            return {"ok": ok}
        return {"ok": ok, "services": services}

    return app


async def serve(bus: Any, stop: asyncio.Event, settings: Settings) -> None:
    """Serve the control API on `settings.api_host:settings.api_port` until `stop` is set.
    A port it cannot bind raises (`ListenError`): the stack restarts it, the rest runs on."""
    from agentrl.core.apiauth import check_exposure
    from agentrl.core.httpserve import serve_http

    check_exposure(
        settings.api_host, bool(settings.api_tokens), "the control API", settings.allow_open
    )
    log.info("control API on http://%s:%s", settings.api_host, settings.api_port)
    await serve_http(
        create_app(settings, bus),
        settings.api_host,
        settings.api_port,
        stop,
        "the control API",
        lifespan="on",
    )
