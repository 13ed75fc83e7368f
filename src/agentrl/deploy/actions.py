"""What can happen to a deployment, as functions over the registry and the bus: register,
start a rollout, set a step, promote, roll back, pause, resume. The controller, the control
API and the CLI all call these, so a human's action and the monitor's go through the same
checks and leave the same audit trail (every call records who, why and the evidence) and
publish the same `agent.rl.model.deployed.v1` event.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from agentrl.contracts.base import new_id, utcnow
from agentrl.contracts.deployment import ModelDeployed
from agentrl.deploy.config import RolloutPlan
from agentrl.deploy.errors import DeployError
from agentrl.deploy.registry import Decision, ModelRecord, Registry, Rollout, Split
from agentrl.logs import audit
from agentrl.observability import instrument as obs

log = logging.getLogger(__name__)


def _job_id(record: ModelRecord) -> str:
    if record.training_job_id:
        return record.training_job_id
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"agentrl-model:{record.model_id}"))


def build_event(
    record: ModelRecord,
    *,
    public_name: str,
    endpoint: str,
    weight: float,
    strategy: str,
    action: str,
    reason: str,
    rollout: Rollout | None = None,
    previous: str | None = None,
    deployed_by: str = "agentrl-deploy-controller",
    approval: str = "automated",
) -> ModelDeployed:
    """The seed's deployed payload for one step (agentrl's extras sit in nested objects)."""
    schedule: list[dict[str, Any]] = []
    if rollout is not None:
        at = rollout.started_at
        for step in rollout.plan.steps:
            schedule.append({"timestamp": at.isoformat(), "percentage": step.weight})
            at = at + timedelta(seconds=step.pause_s)
    vr = record.validation_results or {}
    info: dict[str, Any] = {
        "model_id": record.model_id,
        "base_model": record.base_model,
        "checkpoint_path": record.checkpoint_path or f"base:{record.base_model}",
        "training_date": record.created_at.isoformat(),
    }
    if record.training_samples:
        info["training_samples"] = record.training_samples
    if record.final_reward is not None:
        info["final_reward"] = record.final_reward
    meta: dict[str, Any] = {
        "deployed_by": deployed_by,
        "approval_status": approval,
        "action": action,
        "reason": reason,
        "public_model": public_name,
    }
    if previous:
        meta["previous_model"] = previous
    if rollout is not None:
        meta["rollout_id"] = rollout.deployment_id
        meta["step"] = rollout.step
    validation: dict[str, Any] = {
        "benchmark_passed": bool(vr.get("benchmark_passed", True)),
        "safety_checks_passed": bool(vr.get("safety_checks_passed", True)),
        "performance_regression": bool(vr.get("performance_regression", False)),
    }
    if vr.get("human_eval_score") is not None:
        validation["human_eval_score"] = float(vr["human_eval_score"])
    return ModelDeployed.model_validate(
        {
            "deployment_id": new_id(),
            "training_job_id": _job_id(record),
            "timestamp": utcnow().isoformat(),
            "model_info": info,
            "deployment_config": {
                "serving_platform": "agentrl-gateway",
                "endpoint": endpoint,
                "model_name": record.model_id,
                "rollout_strategy": strategy,
                "traffic_percentage": float(weight),
                "ramp_schedule": schedule,
            },
            "validation_results": validation,
            "metadata": meta,
        }
    )


class Deployer:
    """The actions on one public model name."""

    def __init__(
        self,
        registry: Registry,
        bus: Any,
        public_name: str = "agentrl-policy",
        endpoint: str = "http://127.0.0.1:8700/v1/chat/completions",
    ) -> None:
        self.registry = registry
        self.bus = bus
        self.public = public_name
        self.endpoint = endpoint

    async def _publish(self, record: ModelRecord, **kw: Any) -> None:
        if self.bus is None:
            return
        event = build_event(record, public_name=self.public, endpoint=self.endpoint, **kw)
        await self.bus.publish(event)
        obs.deployment_action(kw.get("action"), record.model_id, kw.get("weight"))
        audit(f"deployment.{kw.get('action')}", actor=kw.get("deployed_by"), model_id=record.model_id,
              deployment_id=event.deployment_id, weight=kw.get("weight"), reason=kw.get("reason"))  # fmt: skip

    # ---- registration -------------------------------------------------------------------
    async def bootstrap(
        self,
        base_model: str,
        by: str = "agentrl-deploy-controller",
        base_spec: dict[str, Any] | None = None,
    ) -> ModelRecord | None:
        """Make the base model the live version when nothing serves yet (first start)."""
        split, _ = await self.registry.get_split(self.public)
        if split is not None and split.live:
            return None
        model_id = f"{self.public}-base"
        record = await self.registry.get_model(model_id)
        if record is None:
            record = ModelRecord(
                model_id=model_id,
                version=0,
                public_name=self.public,
                base_model=base_model,
                state="live",
                traffic_weight=100.0,
                best=True,
                serving={"base_spec": base_spec} if base_spec else {},
            )
            record.decide(
                Decision(
                    by=by,
                    action="bootstrap",
                    reason="no live model: serve the base model",
                    from_state=None,
                    to_state="live",
                )
            )
            await self.registry.put_model(record)

        def apply(s: Split) -> None:
            s.weights, s.order, s.live, s.canary = {model_id: 100.0}, [model_id], model_id, None
            s.reason = "bootstrap"

        await self.registry.update_split(self.public, apply)
        return record

    async def register(
        self,
        *,
        checkpoint_path: str,
        base_model: str,
        sha256: str,
        training_job_id: str | None = None,
        training_samples: int | None = None,
        final_reward: float | None = None,
        serving: dict[str, Any] | None = None,
        by: str = "agentrl-deploy-controller",
    ) -> ModelRecord:
        """A new candidate (idempotent per training job)."""
        if training_job_id:
            existing = await self.registry.model_for_job(training_job_id)
            if existing:
                return await self.registry.require_model(existing)
        n = await self.registry.next_version(self.public)
        record = ModelRecord(
            model_id=f"{self.public}-v{n}",
            version=n,
            public_name=self.public,
            base_model=base_model,
            checkpoint_path=checkpoint_path,
            sha256=sha256,
            training_job_id=training_job_id,
            training_samples=training_samples,
            final_reward=final_reward,
            serving=dict(serving or {}),
        )
        record.decide(
            Decision(
                by=by,
                action="register",
                reason="training job completed",
                to_state="candidate",
                evidence={"sha256": sha256},
            )
        )
        await self.registry.put_model(record)
        if training_job_id:
            await self.registry.bind_job(training_job_id, record.model_id)
        return record

    # ---- rollout ------------------------------------------------------------------------
    async def start(
        self,
        model_id: str,
        plan: RolloutPlan,
        *,
        by: str = "agentrl-deploy-controller",
        approval: str = "automated",
        reason: str = "validation passed",
    ) -> Rollout:
        record = await self.registry.require_model(model_id)
        current = await self.registry.get_rollout(self.public)
        if current is not None and current.status == "running":
            raise DeployError(
                f"a rollout of {current.model_id} is running; promote or roll it back first"
            )
        if record.state == "rejected" and approval != "manual_approved":
            raise DeployError(f"{model_id} failed validation; only a human may deploy it")
        split, _ = await self.registry.get_split(self.public)
        live = split.live if split else None
        if live == model_id:
            raise DeployError(f"{model_id} is already live")
        if live is None:  # nothing to compare with: all traffic at once
            plan = RolloutPlan(strategy="immediate", steps=[plan.steps[-1]], analysis=plan.analysis)
        rollout = Rollout(
            model_id=model_id,
            plan=plan,
            deployment_id=new_id(),
            training_job_id=record.training_job_id,
            previous_model=live,
            approval_status=approval,  # type: ignore[arg-type]
            deployed_by=by,
        )
        await self.registry.put_rollout(self.public, rollout)
        await self.set_step(rollout, 0, by=by, reason=reason)
        return rollout

    async def set_step(self, rollout: Rollout, step: int, *, by: str, reason: str) -> Rollout:
        weight = rollout.plan.steps[step].weight
        await self._route(rollout.model_id, rollout.previous_model, weight, reason)
        rollout.step = step
        rollout.step_started_at = utcnow()
        rollout.failures = 0
        await self.registry.put_rollout(self.public, rollout)
        record = await self.registry.transition(
            rollout.model_id,
            "canary",
            by=by,
            action="set_weight",
            reason=f"step {step + 1}/{len(rollout.plan.steps)}: {weight:g} % ({reason})",
            weight=weight,
            evidence={"step": step, "plan": rollout.plan.model_dump()},
        )
        await self._publish(
            record,
            weight=weight,
            strategy=rollout.plan.strategy,
            action="step",
            reason=reason,
            rollout=rollout,
            previous=rollout.previous_model,
            deployed_by=by,
            approval=rollout.approval_status,
        )
        return rollout

    async def _route(self, new: str, live: str | None, weight: float, reason: str) -> Split:
        if not 0.0 <= weight <= 100.0:
            raise DeployError(f"a ramp to {weight} % is not possible: weights are 0..100 percent")

        def apply(s: Split) -> None:
            if live is None or weight >= 100.0:
                s.weights = {new: 100.0}
            else:
                s.weights = {new: weight, live: 100.0 - weight} if weight > 0 else {live: 100.0}
            s.order = [new] + ([live] if live else [])
            s.canary = new if (weight < 100.0 and live) else s.canary
            s.reason = reason

        return await self.registry.update_split(self.public, apply)

    async def set_weight(self, weight: float, *, by: str, reason: str = "manual ramp") -> Rollout:
        """A human moves the running canary to `weight` percent."""
        if not 0.0 <= weight <= 100.0:
            raise DeployError(f"cannot ramp to {weight} %: the weight must be between 0 and 100")
        rollout = await self._running()
        if weight >= 100.0:
            await self.promote(by=by, reason=reason)
            return rollout
        await self._route(rollout.model_id, rollout.previous_model, weight, reason)
        await self.registry.transition(
            rollout.model_id, "canary", by=by, action="set_weight", reason=reason, weight=weight
        )
        record = await self.registry.require_model(rollout.model_id)
        await self._publish(
            record,
            weight=weight,
            strategy=rollout.plan.strategy,
            action="manual_weight",
            reason=reason,
            rollout=rollout,
            previous=rollout.previous_model,
            deployed_by=by,
            approval="manual_approved",
        )
        return rollout

    async def _running(self) -> Rollout:
        rollout = await self.registry.get_rollout(self.public)
        if rollout is None or rollout.status != "running":
            raise DeployError(f"no rollout of {self.public} is running")
        return rollout

    async def promote(
        self,
        model_id: str | None = None,
        *,
        by: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> ModelRecord:
        """Give the new version all traffic and make it live; the old live one retires."""
        rollout = await self.registry.get_rollout(self.public)
        if (
            rollout is not None
            and rollout.status == "running"
            and model_id in (None, rollout.model_id)
        ):
            model_id = rollout.model_id
        elif model_id is None:
            raise DeployError("nothing to promote: no rollout is running; name a model")
        split, _ = await self.registry.get_split(self.public)
        old = split.live if split else None
        if old == model_id:
            raise DeployError(f"{model_id} is already live")

        def apply(s: Split) -> None:
            s.weights, s.order, s.canary = {model_id: 100.0}, [model_id], None
            if s.live and s.live != model_id:
                s.previous_live = [*s.previous_live, s.live][-16:]
            s.live = model_id
            s.reason = f"promoted: {reason}"

        await self.registry.update_split(self.public, apply)
        record = await self.registry.transition(
            model_id,
            "live",
            by=by,
            action="promote",
            reason=reason,
            evidence=evidence,
            weight=100.0,
        )
        if old:
            await self.registry.transition(
                old, "retired", by=by, action="retire", reason=f"replaced by {model_id}", weight=0.0
            )
        await self._mark_best(record)
        if rollout is not None and rollout.model_id == model_id:
            await self.registry.put_rollout(self.public, None)
        strategy = rollout.plan.strategy if rollout else "immediate"
        approval = "automated" if by == "agentrl-deploy-controller" else "manual_approved"
        await self._publish(
            record,
            weight=100.0,
            strategy=strategy,
            action="promote",
            reason=reason,
            rollout=rollout,
            previous=old,
            deployed_by=by,
            approval=approval,
        )
        return record

    async def rollback(
        self, *, by: str, reason: str, evidence: dict[str, Any] | None = None
    ) -> ModelRecord:
        """Traffic back to the previous version at once. With a rollout running: the
        canary is rolled back and the live version keeps everything; otherwise the live
        version is replaced by the one live before it."""
        rollout = await self.registry.get_rollout(self.public)
        split, _ = await self.registry.get_split(self.public)
        bad: str | None
        restore: str | None
        if rollout is not None and rollout.status == "running":
            bad, restore = rollout.model_id, rollout.previous_model
        else:
            if split is None or not split.previous_live:
                raise DeployError(f"cannot roll back {self.public}: no previous version to restore")
            bad, restore = split.live, split.previous_live[-1]
        if restore is None:
            raise DeployError(f"cannot roll back {bad}: no previous version to restore")

        def apply(s: Split) -> None:
            s.weights, s.order, s.canary = {restore: 100.0}, [restore], None
            if s.live == bad:
                s.previous_live = [v for v in s.previous_live if v != restore]
            s.live = restore
            s.reason = f"rolled back {bad}: {reason}"

        await self.registry.update_split(self.public, apply)
        if bad:
            await self.registry.transition(
                bad,
                "rolled_back",
                by=by,
                action="rollback",
                reason=reason,
                evidence=evidence,
                weight=0.0,
            )
        restored = await self.registry.require_model(restore)
        if restored.state != "live":
            restored = await self.registry.transition(
                restore, "live", by=by, action="restore", reason=f"rollback of {bad}", weight=100.0
            )
        if rollout is not None and rollout.status == "running":
            await self.registry.put_rollout(self.public, None)
        approval = "automated" if by == "agentrl-deploy-controller" else "manual_approved"
        await self._publish(
            restored,
            weight=100.0,
            strategy="immediate",
            action="rollback",
            reason=f"rolled back {bad}: {reason}",
            previous=bad,
            deployed_by=by,
            approval=approval,
        )
        return restored

    async def pause(self, *, by: str, reason: str = "paused by a human") -> Rollout:
        rollout = await self._running()
        rollout.paused = True
        await self.registry.put_rollout(self.public, rollout)
        await self.registry.record(
            rollout.model_id, by=by, action="pause", reason=reason, evidence={}
        )
        return rollout

    async def resume(self, *, by: str, reason: str = "resumed by a human") -> Rollout:
        rollout = await self._running()
        rollout.paused = False
        rollout.step_started_at = utcnow()
        await self.registry.put_rollout(self.public, rollout)
        await self.registry.record(
            rollout.model_id, by=by, action="resume", reason=reason, evidence={}
        )
        return rollout

    async def _mark_best(self, record: ModelRecord) -> None:
        """Keep `best` on the live model with the highest benchmark score (kept forever)."""
        score = (record.validation_details.get("benchmark") or {}).get("mean")
        if score is None:
            return
        others = [
            m
            for m in await self.registry.list_models(self.public)
            if m.best and m.model_id != record.model_id
        ]
        best_other = max(
            (
                (m.validation_details.get("benchmark") or {}).get("mean", float("-inf"))
                for m in others
            ),
            default=float("-inf"),
        )
        if score >= best_other:
            await self.registry.update_model(record.model_id, lambda r: setattr(r, "best", True))


def checkpoint_sha(path: str, cache_dir: Path) -> str:
    """sha256 of a checkpoint's manifest (raises when it is not a complete checkpoint)."""
    from agentrl.deploy.backends import fetch_checkpoint, manifest_sha256

    folder = fetch_checkpoint(path, cache_dir)
    if not (folder / "manifest.json").exists():
        raise DeployError(f"{path} has no manifest.json: not a complete agentrl checkpoint")
    return manifest_sha256(folder)
