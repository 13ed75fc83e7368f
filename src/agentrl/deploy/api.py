"""Deployment routes of the control API (`/deploy/...`): the registry, the split, and the
human-in-the-loop actions (promote, rollback, pause, resume, set weight, deploy a model).

Reads need the scope `deploy:read`, actions `deploy:write` (when tokens are configured).
Actions go through `agentrl.deploy.actions.Deployer`, the same checks and audit trail as the
controller's; the gateway picks the new split up from the registry within a fraction of a
second.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.apiauth import caller, require_scope
from agentrl.deploy.actions import Deployer
from agentrl.deploy.agent import tensorzero_experimentation
from agentrl.deploy.config import DeploySettings, Strategy
from agentrl.deploy.errors import DeployError, UnknownModel
from agentrl.deploy.registry import Registry

router = APIRouter(prefix="/deploy", tags=["deploy"])


class Action(BaseModel):
    """An action's body. Who did it is not the caller's to say: the audit trail records the
    name of the bearer token (`api:anonymous` on an open API), and a `by` field is refused."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field("manual action", description="Why (kept in the audit trail).")

    @field_validator("reason")
    @classmethod
    def _redacted(cls, reason: str) -> str:
        """Free text that is stored and published: no PII (agentrl.rewards.redact)."""
        from agentrl.rewards.redact import redact_payload

        return str(redact_payload(reason)[0])


class Promote(Action):
    model_id: str | None = None


class Weight(Action):
    weight: float


class Deploy(Action):
    model_id: str
    strategy: Strategy | None = None


async def _deployer(request: Request) -> Deployer:
    bus = request.app.state.bus
    if bus is None:
        raise HTTPException(503, "the control API has no bus: start it with `agentrl up`")
    deploy = getattr(request.app.state, "deploy_settings", None) or DeploySettings()
    cache = getattr(request.app.state, "deploy_registry", None)
    if cache is None:
        cache = await Registry.open(bus.js, deploy.bucket)
        request.app.state.deploy_registry = cache
    s = request.app.state.settings
    return Deployer(
        cache,
        bus,
        deploy.public_model,
        f"http://{s.gateway_host}:{s.gateway_port}/v1/chat/completions",
    )


def _refused(exc: DeployError) -> HTTPException:
    """404 for a model id the registry does not know, 409 for a refused action; either way
    nothing was written (every action checks before its first write)."""
    return HTTPException(404 if isinstance(exc, UnknownModel) else 409, str(exc))


@router.get("/models", dependencies=[Depends(require_scope("deploy:read"))])
async def models(request: Request) -> list[dict[str, Any]]:
    d = await _deployer(request)
    return [m.model_dump(mode="json") for m in await d.registry.list_models()]


@router.get("/models/{model_id}", dependencies=[Depends(require_scope("deploy:read"))])
async def model(model_id: str, request: Request) -> dict[str, Any]:
    d = await _deployer(request)
    record = await d.registry.get_model(model_id)
    if record is None:
        raise HTTPException(404, f"no model {model_id!r}")
    return record.model_dump(mode="json")


@router.get("/split", dependencies=[Depends(require_scope("deploy:read"))])
async def split(request: Request) -> dict[str, Any]:
    d = await _deployer(request)
    s, _ = await d.registry.get_split(d.public)
    rollout = await d.registry.get_rollout(d.public)
    return {
        "split": s.model_dump(mode="json") if s else None,
        "rollout": rollout.model_dump(mode="json") if rollout else None,
    }


@router.get(
    "/tensorzero",
    dependencies=[Depends(require_scope("deploy:read"))],
    response_class=PlainTextResponse,
)
async def tensorzero(request: Request, function: str = "agent") -> str:
    d = await _deployer(request)
    s, _ = await d.registry.get_split(d.public)
    return tensorzero_experimentation(function, s.weights if s else {})


@router.post("/promote", dependencies=[Depends(require_scope("deploy:write"))])
async def promote(body: Promote, request: Request) -> dict[str, Any]:
    d = await _deployer(request)
    try:
        record = await d.promote(body.model_id, by=caller(request), reason=body.reason)
    except DeployError as exc:
        raise _refused(exc) from exc
    return record.model_dump(mode="json")


@router.post("/rollback", dependencies=[Depends(require_scope("deploy:write"))])
async def rollback(body: Action, request: Request) -> dict[str, Any]:
    d = await _deployer(request)
    try:
        record = await d.rollback(by=caller(request), reason=body.reason)
    except DeployError as exc:
        raise _refused(exc) from exc
    return record.model_dump(mode="json")


@router.post("/pause", dependencies=[Depends(require_scope("deploy:write"))])
async def pause(body: Action, request: Request) -> dict[str, Any]:
    d = await _deployer(request)
    try:
        return (await d.pause(by=caller(request), reason=body.reason)).model_dump(mode="json")
    except DeployError as exc:
        raise _refused(exc) from exc


@router.post("/resume", dependencies=[Depends(require_scope("deploy:write"))])
async def resume(body: Action, request: Request) -> dict[str, Any]:
    d = await _deployer(request)
    try:
        return (await d.resume(by=caller(request), reason=body.reason)).model_dump(mode="json")
    except DeployError as exc:
        raise _refused(exc) from exc


@router.post("/weight", dependencies=[Depends(require_scope("deploy:write"))])
async def weight(body: Weight, request: Request) -> dict[str, Any]:
    d = await _deployer(request)
    try:
        return (await d.set_weight(body.weight, by=caller(request), reason=body.reason)).model_dump(
            mode="json"
        )
    except DeployError as exc:
        raise _refused(exc) from exc


@router.post("/deploy", dependencies=[Depends(require_scope("deploy:write"))])
async def deploy(body: Deploy, request: Request) -> dict[str, Any]:
    """Start a rollout of a registered model (a human may override a failed validation)."""
    d = await _deployer(request)
    settings = getattr(request.app.state, "deploy_settings", None) or DeploySettings()
    try:
        rollout = await d.start(
            body.model_id,
            settings.plan(body.strategy),
            by=caller(request),
            approval="manual_approved",
            reason=body.reason,
        )
    except DeployError as exc:
        raise _refused(exc) from exc
    return rollout.model_dump(mode="json")
