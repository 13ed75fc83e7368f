"""The /training, /models and /feedback routes of the control API (mounted by agentrl.api).

Thin over the bus: start publishes `agent.rl.training.request.v1`, cancel publishes
`agent.rl.training.cancel.v1`, status and lists read the service's KV bucket, feedback
publishes `agent.rl.feedback.v1`. Scopes: `training:read`, `training:write`, `feedback:write`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.apiauth import require_scope
from agentrl.contracts.base import new_id, utcnow
from agentrl.contracts.feedback import FeedbackEvent
from agentrl.contracts.training import TrainingStatus
from agentrl.training.kv import (
    CANCEL_SUBJECT,
    IDEM_BUCKET,
    all_statuses,
    bucket,
    read_status,
)
from agentrl.training.requests import fill_request
from agentrl.training.settings import TrainingSettings

router = APIRouter(tags=["training"])
JobState = Literal["queued", "running", "completed", "failed", "cancelled"]

START_EXAMPLE = {
    "training_config": {
        "algorithm": "grpo",
        "base_model": "smollm2",
        "dataset": {"filter": {"min_reward": 0.5, "task_domains": ["coding"]}, "sample_size": 5000},
        "hyperparameters": {"learning_rate": 1e-5, "batch_size": 32, "epochs": 1},
    },
    "priority": "normal",
    "metadata": {"requested_by": "alice", "notes": "manual run"},
}


class StartResponse(BaseModel):
    training_job_id: str
    status: JobState | Literal["submitted"]
    idempotent_replay: bool = Field(False, description="True: an earlier call with this key.")


class CancelResponse(BaseModel):
    training_job_id: str
    cancel_requested: bool


class JobList(BaseModel):
    jobs: list[dict[str, Any]]


class ModelEntry(BaseModel):
    model_id: str = Field(description="The training job that produced it.")
    final_checkpoint: str
    base_model: str | None = None
    completed_at: str
    metrics: dict[str, Any] = Field(default_factory=dict)
    evaluation_results: dict[str, Any] = Field(default_factory=dict)
    artifacts: dict[str, Any] = Field(default_factory=dict)


class ModelList(BaseModel):
    models: list[ModelEntry]


class FeedbackIn(BaseModel):
    """Thumbs, a rating or a correction for one trajectory."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str = Field(min_length=1, max_length=200)
    type: Literal["thumbs_up", "thumbs_down", "rating", "correction", "abandoned"]
    rating: int | None = Field(None, ge=1, le=5)
    comment: str | None = Field(None, max_length=20000)
    correction: str | None = Field(
        None, max_length=100000, description="The response the agent should have given."
    )
    session_id: str | None = Field(None, max_length=200)
    user_id: str | None = Field(None, max_length=200)


class FeedbackOut(BaseModel):
    feedback_id: str
    published: bool


def _bus(request: Request) -> Any:
    bus = request.app.state.bus
    if bus is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "no event bus connected")
    return bus


def _tsettings(request: Request) -> TrainingSettings:
    ts = getattr(request.app.state, "training_settings", None)
    if ts is None:
        ts = TrainingSettings()
        request.app.state.training_settings = ts
    return ts


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": ["body", *err["loc"]], "msg": err["msg"], "type": err["type"]}
        for err in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


@router.post(
    "/training/start",
    response_model=StartResponse,
    status_code=status.HTTP_202_ACCEPTED,
    dependencies=[Depends(require_scope("training:write"))],
    summary="Start a training job",
    responses={409: {"description": "Idempotency-Key reused with a different body"}},
)
async def start_training(
    request: Request,
    body: dict[str, Any] = Body(
        default_factory=dict,
        description="The seed's training request fields; any left out take the service's "
        "defaults (a full `agent.rl.training.request.v1` payload is built and validated).",
        examples=[START_EXAMPLE],
    ),
    idempotency_key: str | None = Header(
        None, max_length=255, description="Same key + same body: the same job, started once."
    ),
) -> StartResponse:
    bus = _bus(request)
    body = dict(body)
    body.setdefault("trigger_reason", "manual")
    body.setdefault("requester", "control-api")
    kv = None
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()
    key = None
    if idempotency_key is not None:
        key = hashlib.sha256(idempotency_key.encode()).hexdigest()
        kv = await bucket(bus.js, IDEM_BUCKET, ttl=7 * 24 * 3600)
        known = await _idem_get(kv, key)
        if known is not None:
            if known["body_sha256"] != digest:
                raise HTTPException(
                    status.HTTP_409_CONFLICT,
                    "this Idempotency-Key was used with a different request body",
                )
            current = await read_status(bus.js, known["job_id"])
            return StartResponse(
                training_job_id=known["job_id"],
                status=current["status"] if current else "submitted",
                idempotent_replay=True,
            )
    body.setdefault("training_job_id", new_id())
    try:
        req = fill_request(body, _tsettings(request))
    except ValidationError as exc:
        raise RequestValidationError(_errors(exc)) from exc
    if kv is not None and key is not None:
        record = json.dumps({"job_id": req.training_job_id, "body_sha256": digest}).encode()
        try:
            await kv.create(key, record)
        except Exception:  # a concurrent call with the same key won: answer as it did
            known = await _idem_get(kv, key)
            if known is not None and known["body_sha256"] == digest:
                return StartResponse(
                    training_job_id=known["job_id"], status="submitted", idempotent_replay=True
                )
            raise HTTPException(status.HTTP_409_CONFLICT, "Idempotency-Key conflict") from None
    await bus.publish(req)
    return StartResponse(training_job_id=req.training_job_id, status="submitted")


async def _idem_get(kv: Any, key: str) -> dict[str, Any] | None:
    try:
        entry = await kv.get(key)
    except Exception:
        return None
    if not entry.value:
        return None
    data: dict[str, Any] = json.loads(entry.value)
    return data


@router.get(
    "/training/{job_id}/status",
    dependencies=[Depends(require_scope("training:read"))],
    summary="A job's latest status event",
    responses={404: {"description": "Unknown job"}},
)
async def job_status(request: Request, job_id: str) -> dict[str, Any]:
    current = await read_status(_bus(request).js, job_id)
    if current is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"unknown training job {job_id!r} (a job just submitted appears within a second)",
        )
    return TrainingStatus.model_validate(current).model_dump(mode="json", exclude_none=True)


@router.post(
    "/training/{job_id}/cancel",
    response_model=CancelResponse,
    status_code=status.HTTP_202_ACCEPTED,
    dependencies=[Depends(require_scope("training:write"))],
    summary="Cancel a queued or running job (stops within 5 s, keeps its checkpoints)",
    responses={404: {"description": "Unknown job"}, 409: {"description": "Job already ended"}},
)
async def cancel_job(request: Request, job_id: str) -> CancelResponse:
    bus = _bus(request)
    current = await read_status(bus.js, job_id)
    if current is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown training job {job_id!r}")
    if current["status"] in ("completed", "failed", "cancelled"):
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"job {job_id} already ended ({current['status']})"
        )
    payload = {"training_job_id": job_id, "timestamp": utcnow().isoformat()}
    await bus.publish_json(CANCEL_SUBJECT, payload, msg_id=f"cancel:{job_id}")
    return CancelResponse(training_job_id=job_id, cancel_requested=True)


@router.get(
    "/training",
    response_model=JobList,
    dependencies=[Depends(require_scope("training:read"))],
    summary="Jobs and their latest status",
)
async def list_jobs(
    request: Request,
    status_filter: JobState | None = Query(None, alias="status", description="Only this status."),
    limit: int = Query(100, ge=1, le=1000),
) -> JobList:
    jobs = await all_statuses(_bus(request).js)
    if status_filter:
        jobs = [j for j in jobs if j.get("status") == status_filter]
    return JobList(jobs=jobs[-limit:])


@router.get(
    "/models",
    response_model=ModelList,
    dependencies=[Depends(require_scope("training:read"))],
    summary="Finished checkpoints with their metrics",
)
async def list_models(request: Request) -> ModelList:
    out = []
    for s in await all_statuses(_bus(request).js):
        arts = s.get("artifacts") or {}
        if s.get("status") != "completed" or not arts.get("final_checkpoint"):
            continue
        out.append(
            ModelEntry(
                model_id=s["training_job_id"],
                final_checkpoint=arts["final_checkpoint"],
                base_model=arts.get("base_model"),
                completed_at=str(s["timestamp"]),
                metrics=s.get("metrics") or {},
                evaluation_results=s.get("evaluation_results") or {},
                artifacts=arts,
            )
        )
    return ModelList(models=out)


@router.post(
    "/feedback",
    response_model=FeedbackOut,
    status_code=status.HTTP_202_ACCEPTED,
    dependencies=[Depends(require_scope("feedback:write"))],
    summary="Thumbs, rating or correction for a trajectory (-> agent.rl.feedback.v1)",
)
async def feedback(request: Request, body: FeedbackIn) -> FeedbackOut:
    if body.type == "rating" and body.rating is None:
        raise RequestValidationError(
            [
                {
                    "loc": ["body", "rating"],
                    "msg": "rating (1-5) is required when type is 'rating'",
                    "type": "missing",
                }
            ]
        )
    if body.type == "correction" and not (body.correction or body.comment):
        raise RequestValidationError(
            [
                {
                    "loc": ["body", "correction"],
                    "msg": "a correction needs the corrected response",
                    "type": "missing",
                }
            ]
        )
    data: dict[str, Any] = {
        "feedback_id": new_id(),
        "trajectory_id": body.trajectory_id,
        "timestamp": utcnow().isoformat(),
        "type": body.type,
    }
    for name in ("rating", "comment", "session_id", "user_id", "correction"):
        value = getattr(body, name)
        if value is not None:
            data[name] = value
    try:
        event = FeedbackEvent.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(_errors(exc)) from exc
    from agentrl.rewards.redact import redact_event

    event, _ = redact_event(event)  # comments and corrections are free text: no PII
    await _bus(request).publish(event)
    return FeedbackOut(feedback_id=event.feedback_id, published=True)
