"""`/stats/...` on the control API: the warehouse's analytics and dataset export over HTTP.

This is how other processes read the embedded (chdb) warehouse, which only the process of
`agentrl up` (the ingester's) may open. Every route needs the `stats:read` scope when API
tokens are configured. Query routes are plain `def`s: FastAPI runs them in its threadpool,
so a long query never blocks the event loop that the ingester shares.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field

from agentrl.contracts.training import DatasetFilter
from agentrl.core.apiauth import require_scope
from agentrl.core.apideps import get_settings_dep
from agentrl.core.settings import Settings
from agentrl.warehouse.backend import (
    WarehouseDown,
    WarehouseError,
    WarehouseLocked,
    error_code,
)
from agentrl.warehouse.queries import Analytics, run_named

router = APIRouter(
    prefix="/stats", tags=["warehouse"], dependencies=[Depends(require_scope("stats:read"))]
)


def _analytics(settings: Settings = Depends(get_settings_dep)) -> Analytics:
    from agentrl.warehouse.access import analytics

    try:
        return analytics(settings)
    except WarehouseLocked as exc:
        raise HTTPException(503, str(exc)) from exc
    except WarehouseDown as exc:
        raise HTTPException(503, f"the warehouse is not reachable: {exc}") from exc


# Engine errors that mean "this request's parameters are unusable", not "the warehouse is
# unwell": BAD_QUERY_PARAMETER, CANNOT_PARSE_QUOTED_STRING, ARGUMENT_OUT_OF_BOUND.
BAD_REQUEST_CODES = frozenset({457, 26, 69})


def _run(analytics: Analytics, name: str, **kw: Any) -> Any:
    try:
        return run_named(analytics, name, **kw)
    except WarehouseError as exc:
        raise _http_error(exc) from exc


def _http_error(exc: WarehouseError) -> HTTPException:
    if error_code(str(exc)) in BAD_REQUEST_CODES:
        return HTTPException(400, f"the warehouse refused a parameter: {exc}")
    if isinstance(exc, WarehouseDown):
        return HTTPException(503, f"the warehouse is not reachable: {exc}")
    return HTTPException(500, f"warehouse query failed: {exc}")


Since = Query(None, description="Only rows at or after this time (ISO 8601; naive = UTC).")
Until = Query(None, description="Only rows at or before this time (ISO 8601; naive = UTC).")


@router.get("/counts", summary="Distinct events stored per table")
def counts(a: Analytics = Depends(_analytics)) -> dict[str, int]:
    result: dict[str, int] = _run(a, "counts")
    return result


@router.get("/rewards", summary="Reward distribution per model version and domain")
def rewards(
    since: datetime | None = Since,
    until: datetime | None = Until,
    a: Analytics = Depends(_analytics),
) -> list[dict[str, Any]]:
    return _run(a, "rewards", since=since, until=until)  # type: ignore[no-any-return]


@router.get("/success", summary="Success rate and mean reward over time per model version")
def success(
    bucket_s: int = Query(3600, gt=0, le=366 * 86400, description="Bucket width in seconds."),
    model: str | None = Query(None, description="Only this model version."),
    since: datetime | None = Since,
    until: datetime | None = Until,
    a: Analytics = Depends(_analytics),
) -> list[dict[str, Any]]:
    return _run(a, "success", bucket_s=bucket_s, model=model, since=since, until=until)  # type: ignore[no-any-return]


@router.get("/lengths", summary="Trajectory length histogram (turns)")
def lengths(
    model: str | None = None, domain: str | None = None, a: Analytics = Depends(_analytics)
) -> list[dict[str, Any]]:
    return _run(a, "lengths", model=model, domain=domain)  # type: ignore[no-any-return]


@router.get("/tools", summary="Slowest tools (p95 duration)")
def tools(
    limit: int = Query(10, gt=0, le=1000), a: Analytics = Depends(_analytics)
) -> list[dict[str, Any]]:
    return _run(a, "tools", limit=limit)  # type: ignore[no-any-return]


@router.get("/failing-tools", summary="Most failing tools")
def failing_tools(
    limit: int = Query(10, gt=0, le=1000), a: Analytics = Depends(_analytics)
) -> list[dict[str, Any]]:
    return _run(a, "failing-tools", limit=limit)  # type: ignore[no-any-return]


@router.get("/feedback", summary="Feedback counts per type")
def feedback(
    since: datetime | None = Since,
    until: datetime | None = Until,
    a: Analytics = Depends(_analytics),
) -> list[dict[str, Any]]:
    return _run(a, "feedback", since=since, until=until)  # type: ignore[no-any-return]


@router.get("/training", summary="Training jobs timeline")
def training(a: Analytics = Depends(_analytics)) -> list[dict[str, Any]]:
    return _run(a, "training")  # type: ignore[no-any-return]


@router.get("/deployments", summary="Deployments timeline")
def deployments(a: Analytics = Depends(_analytics)) -> list[dict[str, Any]]:
    return _run(a, "deployments")  # type: ignore[no-any-return]


@router.get("/models", summary="Model versions")
def models(a: Analytics = Depends(_analytics)) -> list[dict[str, Any]]:
    return _run(a, "models")  # type: ignore[no-any-return]


@router.get("/ingester", summary="The warehouse ingester's status in this process")
def ingester() -> dict[str, Any]:
    from agentrl.warehouse import service

    if service.current is None:
        return {"running_here": False, "state": "not running in this process"}
    return {"running_here": True, **service.current.status.as_dict()}


class ExportRequest(BaseModel):
    """The training request's dataset filter and sample size, plus output options."""

    filter: DatasetFilter = Field(default_factory=DatasetFilter)
    sample_size: int | None = Field(None, gt=0, lt=2**63)
    seed: int = Field(0, ge=0, lt=2**63)
    format: Literal["parquet", "jsonl"] = "parquet"
    include_raw: bool = Field(True, description="Include each stored trajectory's JSON.")


@router.post(
    "/export",
    summary="Export the filtered dataset (Parquet or JSONL)",
    response_class=Response,
    responses={
        200: {"content": {"application/vnd.apache.parquet": {}, "application/x-ndjson": {}}}
    },
)
def export(body: ExportRequest, a: Analytics = Depends(_analytics)) -> Response:
    from agentrl.warehouse.export import select_dataset, to_bytes

    try:
        table = select_dataset(
            a.backend,
            a.db,
            body.filter,
            body.sample_size,
            seed=body.seed,
            include_raw=body.include_raw,
        )
    except WarehouseError as exc:
        raise _http_error(exc) from exc
    except ValueError as exc:  # a filter field no dataset source applies
        raise HTTPException(422, str(exc)) from exc
    media = "application/vnd.apache.parquet" if body.format == "parquet" else "application/x-ndjson"
    return Response(
        to_bytes(table, body.format),
        media_type=media,
        headers={"x-agentrl-rows": str(table.num_rows)},
    )
