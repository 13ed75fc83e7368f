"""The /training, /models and /feedback routes of the control API (mounted by agentrl.app.api).

Thin over the bus: start publishes `agent.rl.training.request.v1`, cancel publishes
`agent.rl.training.cancel.v1`, status and lists read the service's KV bucket, feedback
publishes `agent.rl.feedback.v1`. Scopes: `training:read`, `training:write`, `feedback:write`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.contracts.base import new_id, utcnow
from agentrl.contracts.feedback import FeedbackEvent
from agentrl.contracts.filters import declared
from agentrl.contracts.subjects import TRAINING_REQUEST
from agentrl.contracts.training import TrainingRequest, TrainingStatus
from agentrl.core.apiauth import require_scope
from agentrl.core.errors import BusError
from agentrl.core.settings import get_settings
from agentrl.training.kv import (
    CANCEL_SUBJECT,
    IDEM_BUCKET,
    all_statuses,
    bucket,
    read_status,
)
from agentrl.training.paths import UnsafePath, checkpoint_base
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
    evaluation_results: dict[str, Any] = Field(
        default_factory=dict,
        description="A dataset job's holdout figures are an off-policy estimate (see `method`, "
        "`improvement_ci95_low/high` and `effective_sample_size`), not a replay of the tasks.",
    )
    artifacts: dict[str, Any] = Field(default_factory=dict)


class ModelList(BaseModel):
    models: list[ModelEntry]


class FeedbackIn(BaseModel):
    """Thumbs, a rating or a correction for one trajectory; or, TensorZero-style, a metric
    name and value for an episode, a completion (inference) or a trajectory."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: str | None = Field(None, min_length=1, max_length=200)
    episode_id: str | None = Field(
        None, min_length=1, max_length=200, description="A gateway session key or trace id."
    )
    completion_id: str | None = Field(
        None, min_length=1, max_length=200, description="A chat completion's `id`."
    )
    inference_id: str | None = Field(
        None, min_length=1, max_length=200, description="TensorZero's name for completion_id."
    )
    type: (
        Literal["thumbs_up", "thumbs_down", "rating", "correction", "abandoned", "comment"] | None
    ) = None
    metric_name: str | None = Field(
        None, min_length=1, max_length=200, description="With `value`, instead of `type`."
    )
    value: bool | float | str | None = Field(
        None,
        description="Boolean: thumbs; number in [0, 1]: a rating; string: a comment (metric "
        "'demonstration': the response the agent should have given).",
    )
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
    trajectory_ids: list[str] = Field(
        default_factory=list, description="Every trajectory the feedback reached."
    )


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
            return await _replay(bus, known)
    body.setdefault("training_job_id", new_id())
    try:
        req = fill_request(body, _tsettings(request))
    except ValidationError as exc:
        raise RequestValidationError(_errors(exc)) from exc
    _check_request(request, req)
    data = req.to_json()
    if kv is not None and key is not None:
        # The record keeps the request itself: a retry after a failed publish publishes it
        # again (same job id, same Msg-Id) instead of answering for a job that never exists.
        record = {"job_id": req.training_job_id, "body_sha256": digest, "request": data.decode()}
        try:
            await kv.create(key, json.dumps(record).encode())
        except Exception:  # a concurrent call with the same key won: answer as it did
            known = await _idem_get(kv, key)
            if known is not None and known["body_sha256"] == digest:
                return await _replay(bus, known)
            raise HTTPException(status.HTTP_409_CONFLICT, "Idempotency-Key conflict") from None
    await _publish_request(bus, req.training_job_id, data)
    return StartResponse(training_job_id=req.training_job_id, status="submitted")


def _check_request(request: Request, req: TrainingRequest) -> None:
    """422 for a `checkpointing.storage_path` outside the allowed checkpoint roots and for a
    dataset filter field that no dataset source applies."""
    settings = getattr(request.app.state, "settings", None) or get_settings()
    tc = req.training_config
    try:
        checkpoint_base(tc.checkpointing.storage_path, _tsettings(request), Path(settings.data_dir))
    except UnsafePath as exc:
        loc = ["body", "training_config", "checkpointing", "storage_path"]
        raise RequestValidationError(
            [{"loc": loc, "msg": str(exc), "type": "value_error"}]
        ) from exc
    try:
        declared(tc.dataset.filter)
    except ValueError as exc:
        loc = ["body", "training_config", "dataset", "filter"]
        raise RequestValidationError(
            [{"loc": loc, "msg": str(exc), "type": "value_error"}]
        ) from exc


async def _publish_request(bus: Any, job_id: str, data: bytes) -> None:
    try:
        await bus.publish_raw(TRAINING_REQUEST, data, job_id)
    except BusError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the training request could not be published ({exc}); nothing was started: "
            "retry (with the same Idempotency-Key, the same job)",
        ) from exc


async def _replay(bus: Any, known: dict[str, Any]) -> StartResponse:
    """A repeated Idempotency-Key: the job's status; with none yet, the stored request is
    published again (JetStream drops it as a duplicate if the first publish got through)."""
    current = await read_status(bus.js, known["job_id"])
    if current is None and known.get("request"):
        await _publish_request(bus, known["job_id"], str(known["request"]).encode())
    return StartResponse(
        training_job_id=known["job_id"],
        status=current["status"] if current else "submitted",
        idempotent_replay=True,
    )


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
    body = await _capture_feedback(request, body)
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
        **{k: v for k, v in _capture_extras(body).items() if v is not None},
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
    # an episode id names every trajectory published under it: one event each
    extra = list(getattr(request.state, "more_trajectories", None) or [])
    events = [event] + [
        event.model_copy(update={"feedback_id": new_id(), "trajectory_id": t}) for t in extra
    ]
    for e in events:
        await _bus(request).publish(e)
    return FeedbackOut(
        feedback_id=event.feedback_id,
        published=True,
        trajectory_ids=[e.trajectory_id for e in events if e.trajectory_id],
    )


def _capture_extras(body: FeedbackIn) -> dict[str, Any]:
    return {
        "episode_id": body.episode_id,
        "completion_id": body.completion_id or body.inference_id,
        "metric_name": body.metric_name,
        "value": body.value,
    }


async def _capture_feedback(request: Request, body: FeedbackIn) -> FeedbackIn:
    """Resolve an episode/completion id to its trajectory and a metric to a feedback type
    (agentrl.capture.feedback); the classic form passes through unchanged."""
    from agentrl.capture.feedback import FeedbackValueError, fields_for, resolve
    from agentrl.capture.settings import CaptureSettings

    def invalid(field: str, msg: str) -> RequestValidationError:
        return RequestValidationError([{"loc": ["body", field], "msg": msg, "type": "value_error"}])

    update: dict[str, Any] = {}
    if body.metric_name is not None or body.value is not None:
        if body.metric_name is None or body.value is None:
            raise invalid("value", "metric_name and value go together")
        if body.type is not None:
            raise invalid("type", "give either type or metric_name and value")
        try:
            update.update(fields_for(body.metric_name, body.value))
        except FeedbackValueError as exc:
            raise invalid("value", str(exc)) from exc
        if "comment" in update and body.comment:
            update["comment"] = f"{body.comment}\n{update['comment']}"
    elif body.type is None:
        raise invalid("type", "give type, or metric_name and value")
    completion = body.completion_id or body.inference_id
    if body.trajectory_id is None:
        if not (body.episode_id or completion):
            raise invalid("trajectory_id", "name a trajectory_id, episode_id or completion_id")
        cs = CaptureSettings()
        found = await resolve(
            _bus(request).js,
            cs.index_bucket,
            cs.index_ttl_s,
            episode_id=body.episode_id,
            completion_id=completion,
        )
        if not found:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND,
                "no published trajectory for that episode/completion id (an episode is "
                "published when it ends: POST /v1/episodes/{id}/end on the gateway, or its "
                "idle timeout)",
            )
        update["trajectory_id"] = found[-1]
        request.state.more_trajectories = found[:-1]
    return body.model_copy(update=update) if update else body
