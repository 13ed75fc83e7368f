"""Deployment routes of the control API (`/deploy/...`): the registry, the split, and the
human-in-the-loop actions (promote, rollback, pause, resume, set weight, deploy a model).

Reads need the scope `deploy:read`, actions `deploy:write` (when tokens are configured).
Actions go through `agentrl.release.actions.Deployer`, the same checks and audit trail as the
controller's; the gateway picks the new split up from the registry within a fraction of a
second.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.core.apiauth import caller, require_scope
from agentrl.release.actions import Deployer
from agentrl.release.agent import tensorzero_experimentation
from agentrl.release.lineage import Lineage, Lineages, LineageState, check_name
from agentrl.serving.config import DeploySettings, Strategy
from agentrl.serving.errors import DeployError, UnknownModel
from agentrl.serving.registry import Registry

router = APIRouter(prefix="/deploy", tags=["deploy"])


class Action(BaseModel):
    """An action's body. Who did it is not the caller's to say: the audit trail records the
    name of the bearer token (`api:anonymous` on an open API), and a `by` field is refused."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field("manual action", description="Why (kept in the audit trail).")
    lineage: str | None = Field(
        None, description="The lineage acted on (default: the default public model)."
    )

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


async def _registry(request: Request) -> tuple[Registry, DeploySettings]:
    bus = request.app.state.bus
    if bus is None:
        raise HTTPException(503, "the control API has no bus: start it with `agentrl up`")
    deploy = getattr(request.app.state, "deploy_settings", None) or DeploySettings()
    cache = getattr(request.app.state, "deploy_registry", None)
    if cache is None:
        cache = await Registry.open(bus.js, deploy.bucket)
        request.app.state.deploy_registry = cache
    return cache, deploy


async def _deployer(request: Request, lineage: str | None = None) -> Deployer:
    """The actions on one lineage (None: the default one); 404 for an unknown lineage."""
    registry, deploy = await _registry(request)
    public = deploy.public_model
    if lineage and lineage != public:
        try:
            await Lineages(registry, public).get(lineage)
        except DeployError as exc:
            raise _refused(exc) from exc
        public = lineage
    s = request.app.state.settings
    return Deployer(
        registry,
        request.app.state.bus,
        public,
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
async def split(request: Request, lineage: str | None = None) -> dict[str, Any]:
    d = await _deployer(request, lineage)
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
    d = await _deployer(request, body.lineage)
    try:
        record = await d.promote(body.model_id, by=caller(request), reason=body.reason)
    except DeployError as exc:
        raise _refused(exc) from exc
    return record.model_dump(mode="json")


@router.post("/rollback", dependencies=[Depends(require_scope("deploy:write"))])
async def rollback(body: Action, request: Request) -> dict[str, Any]:
    d = await _deployer(request, body.lineage)
    try:
        record = await d.rollback(by=caller(request), reason=body.reason)
    except DeployError as exc:
        raise _refused(exc) from exc
    return record.model_dump(mode="json")


@router.post("/pause", dependencies=[Depends(require_scope("deploy:write"))])
async def pause(body: Action, request: Request) -> dict[str, Any]:
    d = await _deployer(request, body.lineage)
    try:
        return (await d.pause(by=caller(request), reason=body.reason)).model_dump(mode="json")
    except DeployError as exc:
        raise _refused(exc) from exc


@router.post("/resume", dependencies=[Depends(require_scope("deploy:write"))])
async def resume(body: Action, request: Request) -> dict[str, Any]:
    d = await _deployer(request, body.lineage)
    try:
        return (await d.resume(by=caller(request), reason=body.reason)).model_dump(mode="json")
    except DeployError as exc:
        raise _refused(exc) from exc


@router.post("/weight", dependencies=[Depends(require_scope("deploy:write"))])
async def weight(body: Weight, request: Request) -> dict[str, Any]:
    d = await _deployer(request, body.lineage)
    try:
        return (await d.set_weight(body.weight, by=caller(request), reason=body.reason)).model_dump(
            mode="json"
        )
    except DeployError as exc:
        raise _refused(exc) from exc


@router.post("/deploy", dependencies=[Depends(require_scope("deploy:write"))])
async def deploy(body: Deploy, request: Request) -> dict[str, Any]:
    """Start a rollout of a registered model (a human may override a failed validation)."""
    d = await _deployer(request, body.lineage)
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


# ---- lineages ---------------------------------------------------------------------------


class LineageCreate(Action):
    name: str
    agents: list[str] = Field(default_factory=list, description="Agent ids routed to it.")
    profiles: list[str] = Field(default_factory=list, description="Agent Zero profiles.")
    from_lineage: str | None = Field(
        None, description="Start from this lineage's live version (None: the base model)."
    )
    validation: dict[str, Any] = Field(
        default_factory=dict, description="DeploySettings overrides of its validation."
    )
    triggers: dict[str, Any] = Field(default_factory=dict, description="Training overrides.")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_name(name)

    @field_validator("validation")
    @classmethod
    def _validation(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(
            k
            for k in value
            if k not in DeploySettings.model_fields
            or not k.startswith(("benchmark_", "validat", "regression_", "safety_"))
        )
        if unknown:
            raise ValueError(f"not validation settings: {unknown}")
        DeploySettings.model_validate(value)  # their values are checked too
        return value


class LineageMap(Action):
    agents: list[str] = Field(default_factory=list)
    profiles: list[str] = Field(default_factory=list)


def _lineages(registry: Registry, deploy: DeploySettings) -> Lineages:
    return Lineages(registry, deploy.public_model)


async def _lineage_view(registry: Registry, lin: Lineage) -> dict[str, Any]:
    s, _ = await registry.get_split(lin.name)
    rollout = await registry.get_rollout(lin.name)
    out = lin.model_dump(mode="json")
    out["split"] = s.model_dump(mode="json") if s else None
    out["rollout"] = rollout.model_dump(mode="json") if rollout else None
    return out


@router.get("/lineages", dependencies=[Depends(require_scope("deploy:read"))])
async def lineages(request: Request) -> list[dict[str, Any]]:
    registry, deploy = await _registry(request)
    return [await _lineage_view(registry, lin) for lin in await _lineages(registry, deploy).all()]


@router.post("/lineages", status_code=201, dependencies=[Depends(require_scope("deploy:write"))])
async def create_lineage(body: LineageCreate, request: Request) -> dict[str, Any]:
    """A new lineage: 409 when the name or one of its agents / profiles is taken, 404 when
    `from_lineage` does not exist."""
    registry, deploy = await _registry(request)
    try:
        lin = await _lineages(registry, deploy).create(
            body.name,
            base_model=deploy.base_model,
            agents=body.agents,
            profiles=body.profiles,
            parent=body.from_lineage,
            validation=body.validation,
            triggers=body.triggers,
            by=caller(request),
            reason=body.reason,
            bus=request.app.state.bus,
        )
    except DeployError as exc:
        raise _refused(exc) from exc
    return await _lineage_view(registry, lin)


@router.get("/lineages/{name:path}", dependencies=[Depends(require_scope("deploy:read"))])
async def lineage(name: str, request: Request) -> dict[str, Any]:
    registry, deploy = await _registry(request)
    try:
        lin = await _lineages(registry, deploy).get(name)
    except DeployError as exc:
        raise _refused(exc) from exc
    return await _lineage_view(registry, lin)


async def _set_state(name: str, state: LineageState, body: Action, request: Request) -> Any:
    registry, deploy = await _registry(request)
    try:
        lin = await _lineages(registry, deploy).set_state(
            name, state, by=caller(request), reason=body.reason, bus=request.app.state.bus
        )
    except DeployError as exc:
        raise _refused(exc) from exc
    return await _lineage_view(registry, lin)


@router.post("/lineages/{name:path}/pause", dependencies=[Depends(require_scope("deploy:write"))])
async def pause_lineage(name: str, body: Action, request: Request) -> Any:
    return await _set_state(name, "paused", body, request)


@router.post("/lineages/{name:path}/resume", dependencies=[Depends(require_scope("deploy:write"))])
async def resume_lineage(name: str, body: Action, request: Request) -> Any:
    return await _set_state(name, "active", body, request)


@router.post("/lineages/{name:path}/retire", dependencies=[Depends(require_scope("deploy:write"))])
async def retire_lineage(name: str, body: Action, request: Request) -> Any:
    return await _set_state(name, "retired", body, request)


@router.post("/lineages/{name:path}/map", dependencies=[Depends(require_scope("deploy:write"))])
async def map_lineage(name: str, body: LineageMap, request: Request) -> Any:
    """Route these agents / profiles to `name`: 404 when it does not exist, 409 when it is
    retired."""
    registry, deploy = await _registry(request)
    if not body.agents and not body.profiles:
        raise HTTPException(422, "name at least one agent or profile to map")
    try:
        lin = await _lineages(registry, deploy).assign(
            name, agents=body.agents, profiles=body.profiles, by=caller(request), reason=body.reason
        )
    except DeployError as exc:
        raise _refused(exc) from exc
    return await _lineage_view(registry, lin)
