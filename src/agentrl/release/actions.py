"""What can happen to a deployment, as functions over the registry and the bus: register,
start a rollout, set a step, promote, roll back, pause, resume. The controller, the control
API and the CLI all call these, so a human's action and the monitor's go through the same
checks and leave the same audit trail (every call records who, why and the evidence) and
publish the same `agent.rl.model.deployed.v1` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import uuid
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any

from agentrl.contracts.base import new_id, utcnow
from agentrl.contracts.deployment import ModelDeployed
from agentrl.core.logs import audit
from agentrl.observability import instrument as obs
from agentrl.serving.config import RolloutPlan, Step
from agentrl.serving.errors import DeployError
from agentrl.serving.registry import (
    Decision,
    ModelRecord,
    Registry,
    Rollout,
    Split,
    check_transition,
)

log = logging.getLogger(__name__)

_CONTROLLER = "agentrl-deploy-controller"
PAUSE_AT_ENV = "AGENTRL_DEPLOY_PAUSE_AT"
PAUSE_FILE_ENV = "AGENTRL_DEPLOY_PAUSE_FILE"
# one lock per registry and public name: this process's actions on a name never interleave
_LOCKS: weakref.WeakKeyDictionary[Registry, dict[str, asyncio.Lock]] = weakref.WeakKeyDictionary()


def fault_point(name: str) -> None:
    """Crash injection of the tests and the soak: when AGENTRL_DEPLOY_PAUSE_AT names this
    point (e.g. "rollback:split"), the process says so (stderr, and the file named by
    AGENTRL_DEPLOY_PAUSE_FILE) and stops dead here, between two registry writes, so the
    caller can SIGKILL it there. Unset, it does nothing."""
    if os.environ.get(PAUSE_AT_ENV) != name:
        return
    marker = os.environ.get(PAUSE_FILE_ENV)
    if marker:
        Path(marker).write_text(f"{name} {os.getpid()}\n")
    print(f"agentrl deploy: paused at {name} (pid {os.getpid()})", file=sys.stderr, flush=True)
    while True:  # the whole process stops (the event loop too), as a hang would
        time.sleep(3600)


def _same_running(current: Rollout, read: Rollout) -> None:
    """The precondition of every change of a running rollout, checked on the stored value."""
    if current.deployment_id != read.deployment_id:
        raise DeployError(
            f"the rollout of {read.model_id} was replaced by one of {current.model_id}"
        )
    if current.status != "running":
        raise DeployError(
            f"the rollout of {current.model_id} is {current.status}, no longer running"
        )


def _end(split: Split, rollout_id: str) -> None:
    """The split no longer belongs to `rollout_id` (its late step writes are refused)."""
    if split.rollout_id == rollout_id:
        split.rollout_id = None
    if rollout_id not in split.ended_rollouts:
        split.ended_rollouts = [*split.ended_rollouts, rollout_id][-16:]


def _event_id(rollout: Rollout, what: str) -> str:
    """The same deployed event's id whoever publishes it (JetStream drops the copy)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"agentrl-deploy:{rollout.deployment_id}:{what}"))


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
    """The actions on one public model name.

    Promote and rollback write their intent into `rollout.<name>` first (compare-and-set:
    `status` promoting | rolling_back + `target`), then make each registry write so that
    doing it twice changes nothing; whoever finds a half-done action (a restarted
    controller, the next human action) finishes it (`complete_pending`). Every rollout write
    is compare-and-set and re-checks its precondition on the value it replaces, every split
    write of a step is fenced by the rollout's id, and actions on one public name are
    serialised in this process."""

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

    def _mine(self, record: ModelRecord) -> None:
        """One lineage's actions never route another lineage's versions."""
        if record.public_name != self.public:
            raise DeployError(
                f"{record.model_id} belongs to lineage {record.public_name!r}, not {self.public!r}"
            )

    @property
    def _lock(self) -> asyncio.Lock:
        per_registry = _LOCKS.setdefault(self.registry, {})
        lock = per_registry.get(self.public)
        if lock is None:
            lock = per_registry[self.public] = asyncio.Lock()
        return lock

    async def _publish(self, record: ModelRecord, event_id: str | None = None, **kw: Any) -> None:
        if self.bus is None:
            return
        event = build_event(record, public_name=self.public, endpoint=self.endpoint, **kw)
        if event_id is not None:  # a resumed action publishes the same event (deduplicated)
            event = event.model_copy(update={"deployment_id": event_id})
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
        source: ModelRecord | None = None,
    ) -> ModelRecord | None:
        """Make the base model the live version when nothing serves yet (first start); a
        lineage started from another lineage's live version (`source`) serves a copy of it
        (same checkpoint and checksum) under its own first version id."""
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
            reason = "no live model: serve the base model"
            if source is not None:
                record.base_model = source.base_model
                record.checkpoint_path, record.sha256 = source.checkpoint_path, source.sha256
                record.serving = dict(source.serving)
                record.final_reward = source.final_reward
                record.validation_results = dict(source.validation_results)
                record.validation_details = dict(source.validation_details)
                reason = f"new lineage: starts from {source.model_id}, live in {source.public_name}"
            record.decide(
                Decision(
                    by=by,
                    action="bootstrap",
                    reason=reason,
                    from_state=None,
                    to_state="live",
                    evidence={"source": source.model_id} if source else {},
                )
            )
            await self.registry.put_model(record)

        def apply(s: Split) -> None:
            if s.live:  # someone else bootstrapped meanwhile
                return
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
        async with self._lock:
            await self._complete_pending(by)
            record = await self.registry.require_model(model_id)
            self._mine(record)
            if record.state == "rejected" and approval != "manual_approved":
                raise DeployError(f"{model_id} failed validation; only a human may deploy it")
            split, _ = await self.registry.get_split(self.public)
            live = split.live if split else None
            if live == model_id or record.state == "live":
                raise DeployError(f"{model_id} is already live")
            if record.state != "canary":
                check_transition(record, "canary")
            if live is None:  # nothing to compare with: all traffic at once
                plan = RolloutPlan(
                    strategy="immediate", steps=[plan.steps[-1]], analysis=plan.analysis
                )
            rollout = Rollout(
                model_id=model_id,
                plan=plan,
                deployment_id=new_id(),
                training_job_id=record.training_job_id,
                previous_model=live,
                approval_status=approval,  # type: ignore[arg-type]
                deployed_by=by,
                weight=plan.steps[0].weight,
            )
            rollout = await self.registry.create_rollout(self.public, rollout)
            return await self._enter_step(rollout, by=by, reason=reason)

    async def set_step(
        self, rollout: Rollout, step: int, *, by: str, reason: str, automatic: bool = True
    ) -> Rollout:
        """Move `rollout` from the step it is at (as read by the caller) to `step`. Refused
        (DeployError) when it changed meanwhile: paused (an automatic move), moved, ended."""
        async with self._lock:
            at, weight = rollout.step, rollout.plan.steps[step].weight

            def apply(r: Rollout) -> None:
                _same_running(r, rollout)
                if automatic and r.paused:
                    raise DeployError(f"the rollout of {r.model_id} was paused: not advanced")
                if r.step != at:
                    raise DeployError(f"the rollout of {r.model_id} moved to step {r.step + 1}")
                r.step, r.weight, r.failures, r.last_check = step, weight, 0, {}
                r.step_started_at = utcnow()

            updated = await self.registry.update_rollout(self.public, apply)
            return await self._enter_step(updated, by=by, reason=reason)

    async def _enter_step(self, rollout: Rollout, *, by: str, reason: str) -> Rollout:
        step = rollout.step
        weight = rollout.plan.steps[step].weight
        await self._route(rollout, weight, reason)
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
            event_id=_event_id(rollout, f"step{step}"),
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

    async def _route(self, rollout: Rollout, weight: float, reason: str) -> Split:
        """The split for `rollout` at `weight`: refused when the split no longer belongs to
        it (it ended: rolled back or promoted by someone else) or its live version changed."""
        if not 0.0 <= weight <= 100.0:
            raise DeployError(f"a ramp to {weight} % is not possible: weights are 0..100 percent")
        new, live, rid = rollout.model_id, rollout.previous_model, rollout.deployment_id

        def apply(s: Split) -> None:
            if s.rollout_id != rid:
                if s.rollout_id is not None or rid in s.ended_rollouts or s.live != live:
                    raise DeployError(
                        f"the split of {self.public} no longer belongs to the rollout of {new} "
                        f"(live {s.live}, rollout {s.rollout_id}): not routed"
                    )
                s.rollout_id = rid
            if live is None or weight >= 100.0:
                s.weights = {new: 100.0}
            else:
                s.weights = {new: weight, live: 100.0 - weight} if weight > 0 else {live: 100.0}
            s.order = [new] + ([live] if live else [])
            s.canary = new if (weight < 100.0 and live) else s.canary
            s.reason = reason

        return await self.registry.update_split(self.public, apply)

    async def reconcile(self, rollout: Rollout) -> bool:
        """Route the split to the running rollout's weight when they disagree (a write cut
        off between the rollout and the split); True when it had to."""
        split, _ = await self.registry.get_split(self.public)
        want = (
            rollout.weight
            if rollout.weight is not None
            else rollout.plan.steps[rollout.step].weight
        )
        have = split.weights.get(rollout.model_id, 0.0) if split else 0.0
        owned = split is not None and split.rollout_id == rollout.deployment_id
        if owned and abs(have - want) < 1e-9:
            return False
        async with self._lock:
            current = await self.registry.get_rollout(self.public)
            if current is None or current.deployment_id != rollout.deployment_id:
                return False
            if current.status != "running":
                return False
            await self._route(current, want, "reconciled with the rollout's step")
        return True

    async def set_weight(self, weight: float, *, by: str, reason: str = "manual ramp") -> Rollout:
        """A human moves the running canary to `weight` percent."""
        if not 0.0 <= weight <= 100.0:
            raise DeployError(f"cannot ramp to {weight} %: the weight must be between 0 and 100")
        async with self._lock:
            await self._complete_pending(by)
            rollout = await self._running()
            if weight >= 100.0:
                await self._promote(None, by=by, reason=reason, evidence=None)
                return rollout
            record = await self.registry.require_model(rollout.model_id)
            if record.state != "canary":
                check_transition(record, "canary")

            def apply(r: Rollout) -> None:
                _same_running(r, rollout)
                r.weight = weight

            rollout = await self.registry.update_rollout(self.public, apply)
            await self._route(rollout, weight, reason)
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

    # ---- promote and rollback (intent first, resumable) ---------------------------------
    async def complete_pending(self, by: str = "agentrl-deploy-controller") -> ModelRecord | None:
        """Finish a promote or rollback that was cut off (a crash, a KV timeout); returns
        the version live afterwards, or None when nothing was pending."""
        async with self._lock:
            return await self._complete_pending(by)

    async def _complete_pending(self, by: str) -> ModelRecord | None:
        rollout = await self.registry.get_rollout(self.public)
        if rollout is None or rollout.status not in ("promoting", "rolling_back"):
            return None
        log.warning(
            "%s of %s was cut off: %s finishes it",
            "a promote" if rollout.status == "promoting" else "a rollback",
            rollout.target if rollout.status == "promoting" else rollout.bad,
            by,
        )
        if rollout.status == "promoting":
            return await self._finish_promote(rollout)
        return await self._finish_rollback(rollout)

    async def promote(
        self,
        model_id: str | None = None,
        *,
        by: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> ModelRecord:
        """Give the new version all traffic and make it live; the old live one retires."""
        async with self._lock:
            await self._complete_pending(by)
            return await self._promote(model_id, by=by, reason=reason, evidence=evidence)

    async def _promote(
        self, model_id: str | None, *, by: str, reason: str, evidence: dict[str, Any] | None
    ) -> ModelRecord:
        if model_id is not None:  # an unknown id is refused before anything else
            await self.registry.require_model(model_id)
        rollout = await self.registry.get_rollout(self.public)
        running = rollout if rollout is not None and rollout.status == "running" else None
        if running is not None and model_id in (None, running.model_id):
            target = running.model_id
        elif model_id is None:
            raise DeployError("nothing to promote: no rollout is running; name a model")
        elif running is not None:
            raise DeployError(
                f"a rollout of {running.model_id} is running; promote or roll it back first"
            )
        else:
            target = model_id
        # every check before the first write: an unknown id or a refused transition changes
        # nothing (the split never names a phantom)
        record = await self.registry.require_model(target)
        self._mine(record)
        split, _ = await self.registry.get_split(self.public)
        old = split.live if split else None
        if old == target or record.state == "live":
            raise DeployError(f"{target} is already live")
        check_transition(record, "live")
        old_record = await self.registry.get_model(old) if old else None
        if old_record is not None and old_record.state == "live":
            check_transition(old_record, "retired")
        fields = {
            "status": "promoting",
            "target": target,
            "replaces": old,
            "action_by": by,
            "action_reason": reason,
            "action_evidence": evidence or {},
            "action_at": utcnow(),
        }
        if running is not None:

            def apply(r: Rollout) -> None:
                _same_running(r, running)
                for k, v in fields.items():
                    setattr(r, k, v)

            intent = await self.registry.update_rollout(self.public, apply)
        else:  # a human promotes a named version: the intent is a rollout of its own
            intent = Rollout.model_validate(
                {
                    "model_id": target,
                    "plan": RolloutPlan(strategy="immediate", steps=[Step(weight=100.0)]),
                    "deployment_id": new_id(),
                    "training_job_id": record.training_job_id,
                    "previous_model": old,
                    "approval_status": "automated" if by == _CONTROLLER else "manual_approved",
                    "deployed_by": by,
                    "weight": 100.0,
                    **fields,
                }
            )
            intent = await self.registry.create_rollout(self.public, intent)
        fault_point("promote:intent")
        return await self._finish_promote(intent)

    async def _finish_promote(self, r: Rollout) -> ModelRecord:
        """Every write of a promote, each one idempotent, then the intent is closed."""
        target, old, rid = r.target or r.model_id, r.replaces, r.deployment_id
        by, reason = r.action_by or _CONTROLLER, r.action_reason or "promote"

        def apply(s: Split) -> None:
            if s.live != target:
                if s.live:
                    s.previous_live = [*s.previous_live, s.live][-16:]
                s.live = target
            s.weights, s.order, s.canary = {target: 100.0}, [target], None
            _end(s, rid)
            s.reason = f"promoted: {reason}"

        await self.registry.update_split(self.public, apply)
        fault_point("promote:split")
        record = await self.registry.require_model(target)
        if record.state != "live":
            record = await self.registry.transition(
                target,
                "live",
                by=by,
                action="promote",
                reason=reason,
                evidence=r.action_evidence,
                weight=100.0,
            )
        fault_point("promote:live")
        old_record = await self.registry.get_model(old) if old and old != target else None
        if old_record is not None and old_record.state == "live":
            await self.registry.transition(
                old_record.model_id,
                "retired",
                by=by,
                action="retire",
                reason=f"replaced by {target}",
                weight=0.0,
            )
        await self._mark_best(record)
        await self._publish(
            record,
            event_id=_event_id(r, "promote"),
            weight=100.0,
            strategy=r.plan.strategy,
            action="promote",
            reason=reason,
            rollout=r,
            previous=old,
            deployed_by=by,
            approval="automated" if by == _CONTROLLER else "manual_approved",
        )
        await self._close(r, "promoted")
        return record

    async def rollback(
        self,
        *,
        by: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
        model_id: str | None = None,
        automatic: bool = False,
    ) -> ModelRecord:
        """Traffic back to the previous version at once. With a rollout running: the
        canary is rolled back and the live version keeps everything; otherwise the live
        version is replaced by the one live before it. `model_id` limits it to that version
        (an automatic rollback never takes the live one down after the canary is gone);
        `automatic` respects a human's pause."""
        async with self._lock:
            done = await self._complete_pending(by)
            return await self._rollback(
                by=by,
                reason=reason,
                evidence=evidence,
                model_id=model_id,
                automatic=automatic,
                done=done,
            )

    async def _rollback(
        self,
        *,
        by: str,
        reason: str,
        evidence: dict[str, Any] | None,
        model_id: str | None,
        automatic: bool,
        done: ModelRecord | None,
    ) -> ModelRecord:
        rollout = await self.registry.get_rollout(self.public)
        split, _ = await self.registry.get_split(self.public)
        running = rollout if rollout is not None and rollout.status == "running" else None
        bad: str | None
        restore: str | None
        if running is not None and model_id in (None, running.model_id):
            bad, restore = running.model_id, running.previous_model
        elif model_id is not None and (split is None or split.live != model_id):
            if (
                done is not None
                and rollout is not None
                and rollout.status == "rolled_back"
                and rollout.bad == model_id
            ):
                return done  # the rollback just finished was this one
            raise DeployError(f"{model_id} is neither the running canary nor live: not rolled back")
        else:
            if split is None or not split.previous_live:
                raise DeployError(f"cannot roll back {self.public}: no previous version to restore")
            bad, restore = split.live, split.previous_live[-1]
            running = None
        if restore is None:
            raise DeployError(f"cannot roll back {bad}: no previous version to restore")
        restored = await self.registry.require_model(restore)
        if restored.state != "live":
            check_transition(restored, "live")
        bad_record = await self.registry.get_model(bad) if bad else None
        if bad_record is not None and bad_record.state != "rolled_back":
            check_transition(bad_record, "rolled_back")
        fields = {
            "status": "rolling_back",
            "target": restore,
            "bad": bad,
            "action_by": by,
            "action_reason": reason,
            "action_evidence": evidence or {},
            "action_at": utcnow(),
        }
        if running is not None:

            def apply(r: Rollout) -> None:
                _same_running(r, running)
                if automatic and r.paused:
                    raise DeployError(f"the rollout of {r.model_id} was paused: not rolled back")
                for k, v in fields.items():
                    setattr(r, k, v)

            intent = await self.registry.update_rollout(self.public, apply)
        else:
            intent = Rollout.model_validate(
                {
                    "model_id": bad or restore,
                    "plan": RolloutPlan(strategy="immediate", steps=[Step(weight=100.0)]),
                    "deployment_id": new_id(),
                    "previous_model": restore,
                    "approval_status": "automated" if by == _CONTROLLER else "manual_approved",
                    "deployed_by": by,
                    **fields,
                }
            )
            intent = await self.registry.create_rollout(self.public, intent)
        fault_point("rollback:intent")
        return await self._finish_rollback(intent)

    async def _finish_rollback(self, r: Rollout) -> ModelRecord:
        """Every write of a rollback, each one idempotent, then the intent is closed. The
        rolled-back version is never ramped again by this rollout (its status says so)."""
        bad, restore, rid = r.bad, r.target or r.previous_model, r.deployment_id
        by, reason = r.action_by or _CONTROLLER, r.action_reason or "rollback"
        assert restore is not None

        def apply(s: Split) -> None:
            if s.live == bad:
                s.previous_live = [v for v in s.previous_live if v != restore]
            s.weights, s.order, s.canary = {restore: 100.0}, [restore], None
            s.live = restore
            _end(s, rid)
            s.reason = f"rolled back {bad}: {reason}"

        await self.registry.update_split(self.public, apply)
        fault_point("rollback:split")
        bad_record = await self.registry.get_model(bad) if bad else None
        if bad_record is not None and bad_record.state != "rolled_back":
            await self.registry.transition(
                bad_record.model_id,
                "rolled_back",
                by=by,
                action="rollback",
                reason=reason,
                evidence=r.action_evidence,
                weight=0.0,
            )
        fault_point("rollback:rolled_back")
        restored = await self.registry.require_model(restore)
        if restored.state != "live":
            restored = await self.registry.transition(
                restore, "live", by=by, action="restore", reason=f"rollback of {bad}", weight=100.0
            )
        await self._publish(
            restored,
            event_id=_event_id(r, "rollback"),
            weight=100.0,
            strategy="immediate",
            action="rollback",
            reason=f"rolled back {bad}: {reason}",
            previous=bad,
            deployed_by=by,
            approval="automated" if by == _CONTROLLER else "manual_approved",
        )
        await self._close(r, "rolled_back")
        return restored

    async def _close(self, r: Rollout, status: str) -> None:
        def apply(current: Rollout) -> None:
            if current.deployment_id != r.deployment_id:
                raise DeployError("the rollout was replaced meanwhile")
            if current.status == status:
                return
            if current.status != r.status:
                raise DeployError(f"the rollout is {current.status}, not {r.status}")
            current.status = status  # type: ignore[assignment]

        with contextlib.suppress(DeployError):  # already closed (a concurrent finisher)
            await self.registry.update_rollout(self.public, apply)

    async def pause(self, *, by: str, reason: str = "paused by a human") -> Rollout:
        async with self._lock:
            await self._complete_pending(by)
            rollout = await self._running()

            def apply(r: Rollout) -> None:
                _same_running(r, rollout)
                r.paused = True

            rollout = await self.registry.update_rollout(self.public, apply)
            await self.registry.record(
                rollout.model_id, by=by, action="pause", reason=reason, evidence={}
            )
            return rollout

    async def resume(self, *, by: str, reason: str = "resumed by a human") -> Rollout:
        async with self._lock:
            await self._complete_pending(by)
            rollout = await self._running()

            def apply(r: Rollout) -> None:
                _same_running(r, rollout)
                r.paused, r.escalated = False, False
                r.step_started_at = utcnow()

            rollout = await self.registry.update_rollout(self.public, apply)
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
    from agentrl.serving.backends import fetch_checkpoint, manifest_sha256

    folder = fetch_checkpoint(path, cache_dir)
    if not (folder / "manifest.json").exists():
        raise DeployError(f"{path} has no manifest.json: not a complete agentrl checkpoint")
    return manifest_sha256(folder)
