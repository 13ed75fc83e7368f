"""`GET /metrics` on the control API: the Prometheus text format of every agentrl metric
(merged across job processes in multiprocess mode), refreshed by the scrape-time collectors.

Mounted by `agentrl.app.api` (and therefore served by `agentrl up`); open like Prometheus
endpoints usually are: metrics carry counts and bounded labels, never ids or payloads.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST

from agentrl.core.apideps import get_bus
from agentrl.observability import collectors
from agentrl.observability import metrics as m

router = APIRouter(tags=["observability"])


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
)
async def metrics(bus: Any = Depends(get_bus)) -> Response:
    await collectors.run_collectors(bus)
    return Response(content=m.exposition(), media_type=CONTENT_TYPE_LATEST)
