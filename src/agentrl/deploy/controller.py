"""The deployment controller: completed training jobs in, validated canaries out, and the
monitor that promotes, holds or rolls back.

Consume `agent.rl.training.status.v1`; on `completed` register the checkpoint as a
candidate (its manifest's sha256 recorded), validate it, and start the rollout plan. Every
`analysis.period_s` the monitor compares the new version with the live one since the rollout
began (errors from the gateway's counters, rewards from the reward stream) with the
sequential test; a failed check rolls back at once, a step whose pause has elapsed without a
failed check advances, the last step promotes. Every decision is in the registry with its
evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl.deploy.actions import Deployer, checkpoint_sha
from agentrl.deploy.config import DeploySettings, RolloutPlan
from agentrl.deploy.errors import DeployError
from agentrl.deploy.monitor import RewardTracker, Summary, analyse
from agentrl.deploy.registry import ModelRecord
from agentrl.deploy.sequential import CheckResult
from agentrl.deploy.validation import regression_vs_live
from agentrl.observability import instrument as obs

log = logging.getLogger(__name__)

BY = "agentrl-deploy-controller"
Validate = Callable[
    [ModelRecord, ModelRecord | None], Awaitable[tuple[dict[str, Any], dict[str, Any]]]
]


class Controller:
    def __init__(
        self,
        deployer: Deployer,
        settings: DeploySettings,
        *,
        stats: Mapping[str, Any],
        tracker: RewardTracker,
        cache_dir: Path,
        validate: Validate | None = None,
        plan: RolloutPlan | None = None,
    ) -> None:
        self.deployer = deployer
        self.registry = deployer.registry
        self.settings = settings
        self.stats = stats  # model_id -> VersionStats (the gateway's counters)
        self.tracker = tracker
        self.cache_dir = cache_dir
        self.validate = validate
        self.plan = plan or settings.plan()
        self._baselines: dict[str, tuple[float, dict[str, tuple[int, int]]]] = {}
        self.last_action: tuple[float, str] | None = None
        self.ticks: list[float] = []  # when each look happened (benchmarks), last 1000

    # ---- training -> candidate ----------------------------------------------------------
    async def handle_status(self, event: Any) -> ModelRecord | None:
        if event.status != "completed":
            return None
        artifacts = event.artifacts
        ckpt = getattr(artifacts, "final_checkpoint", None) if artifacts else None
        if not ckpt:
            log.warning(
                "job %s completed without artifacts.final_checkpoint", event.training_job_id
            )
            return None
        extra = (artifacts.model_extra or {}) if artifacts else {}
        base = extra.get("base_model") or self.settings.base_model
        try:
            sha = await asyncio.to_thread(checkpoint_sha, ckpt, self.cache_dir)
        except Exception as exc:
            log.error("job %s: checkpoint %s unusable: %s", event.training_job_id, ckpt, exc)
            sha = ""
        serving: dict[str, Any] = {}
        spec = _base_spec(ckpt, self.cache_dir)
        if spec:
            serving["base_spec"] = spec
        best = getattr(getattr(event, "metrics", None), "best", None)
        record = await self.deployer.register(
            checkpoint_path=ckpt,
            base_model=str(base),
            sha256=sha,
            training_job_id=event.training_job_id,
            final_reward=getattr(best, "reward_mean", None) if best else None,
            serving=serving,
        )
        if record.state != "candidate" or len(record.decisions) > 1:
            return record  # seen before (redelivery): already handled
        if not sha:
            return await self.registry.transition(
                record.model_id,
                "rejected",
                by=BY,
                action="reject",
                reason=f"{ckpt} is not a complete checkpoint (no manifest.json)",
            )
        return await self.validate_and_deploy(record)

    async def validate_and_deploy(self, record: ModelRecord) -> ModelRecord:
        if self.validate is not None and self.settings.validate_models:
            split, _ = await self.registry.get_split(self.deployer.public)
            live = await self.registry.get_model(split.live) if split and split.live else None
            try:
                results, details = await self.validate(record, live)
            except Exception as exc:
                return await self.registry.transition(
                    record.model_id,
                    "rejected",
                    by=BY,
                    action="reject",
                    reason=f"validation could not run: {type(exc).__name__}: {exc}",
                )

            def store(r: ModelRecord) -> None:
                r.validation_results, r.validation_details = results, details

            record = await self.registry.update_model(record.model_id, store)
            failed = [
                k
                for k, bad in (
                    ("benchmark", not results["benchmark_passed"]),
                    ("safety", not results["safety_checks_passed"]),
                    ("regression", results["performance_regression"]),
                )
                if bad
            ]
            if failed:
                reasons = "; ".join(details.get("reasons", [])) or ", ".join(failed)
                return await self.registry.transition(
                    record.model_id,
                    "rejected",
                    by=BY,
                    action="reject",
                    reason=f"validation failed: {reasons}",
                    evidence={"validation_results": results},
                )
            await self.registry.record(
                record.model_id,
                by=BY,
                action="validate",
                reason="validation passed",
                evidence={"validation_results": results},
            )
            if self.deployer.bus is not None:
                payload = {
                    "model_id": record.model_id,
                    "validation_results": results,
                    "details": details,
                }
                await self.deployer.bus.publish_raw(
                    "agent.rl.model.validated.v1",
                    json.dumps(payload, default=str).encode(),
                    f"validated:{record.model_id}",
                )
        if self.settings.auto_deploy:
            try:
                await self.deployer.start(record.model_id, self.plan, by=BY)
            except DeployError as exc:
                await self.registry.record(
                    record.model_id,
                    by=BY,
                    action="wait",
                    reason=f"not deployed yet: {exc}",
                    evidence={},
                )
        return await self.registry.require_model(record.model_id)

    # ---- monitor ------------------------------------------------------------------------
    def _counts(self, model_id: str | None) -> tuple[int, int]:
        s = self.stats.get(model_id) if model_id else None
        return (s.requests, s.errors) if s is not None else (0, 0)

    async def tick(self) -> str | None:
        """One look at the running rollout; returns what was done (or None)."""
        self.ticks = [*self.ticks[-999:], time.time()]
        rollout = await self.registry.get_rollout(self.deployer.public)
        if rollout is None or rollout.status != "running":
            return await self.deploy_waiting()
        if rollout.paused:
            return "paused"
        new, live = rollout.model_id, rollout.previous_model
        if rollout.deployment_id not in self._baselines:
            self._baselines = {
                rollout.deployment_id: (time.time(), {v: self._counts(v) for v in (new, live) if v})
            }
        _, base = self._baselines[rollout.deployment_id]
        since = rollout.started_at.timestamp()  # rewards carry their arrival time

        def summary(v: str | None) -> Summary:
            if v is None:
                return Summary()
            req, err = self._counts(v)
            b_req, b_err = base.get(v, (0, 0))
            n, total = self.tracker.summary(v, since)
            obs.deployment(rewards={v: total / n} if n else None)  # reward per version gauge
            return Summary(req - b_req, err - b_err, n, total)

        plan = rollout.plan
        step = plan.steps[rollout.step]
        elapsed = time.time() - rollout.step_started_at.timestamp()
        checks: list[CheckResult] = []
        if live is None:
            verdict = "pass"
        else:
            verdict, checks = analyse(summary(new), summary(live), plan.analysis)
        evidence = {
            "verdict": verdict,
            "step": rollout.step,
            "weight": step.weight,
            "checks": [c.to_dict() for c in checks],
            "step_elapsed_s": round(elapsed, 3),
        }
        if verdict == "fail":
            rollout.failures += 1
            if rollout.failures >= plan.analysis.failure_threshold:
                why = "; ".join(f"{c.metric}: {c.reason}" for c in checks if c.verdict == "fail")
                await self.deployer.rollback(
                    by=BY, reason=f"analysis failed: {why}", evidence=evidence
                )
                return self._did("rollback")
            await self.registry.put_rollout(self.deployer.public, rollout)
        ready = elapsed >= step.pause_s and verdict != "fail"
        if ready and (plan.analysis.advance_on == "no_failure" or verdict == "pass"):
            if rollout.step + 1 < len(plan.steps):
                await self.registry.record(
                    new,
                    by=BY,
                    action="advance",
                    reason=f"step {rollout.step + 1} held {elapsed:.1f}s, no failed check",
                    evidence=evidence,
                )
                await self.deployer.set_step(
                    rollout, rollout.step + 1, by=BY, reason="analysis: no failed check"
                )
                return self._did("advance")
            await self.deployer.promote(
                by=BY, reason="every step passed its analysis", evidence=evidence
            )
            return self._did("promote")
        if rollout.last_check.get("verdict") != verdict:  # record holds when the verdict changes
            rollout.last_check = {"verdict": verdict}
            await self.registry.put_rollout(self.deployer.public, rollout)
            await self.registry.record(
                new, by=BY, action="hold", reason=f"analysis {verdict}", evidence=evidence
            )
        return "hold"

    async def deploy_waiting(self) -> str | None:
        """No rollout running: deploy the newest validated candidate that had to wait for
        the previous rollout; older waiting ones are superseded (a newer job built on them,
        or on the same live model, has passed validation since)."""
        if not self.settings.auto_deploy:
            return None
        records = await self.registry.list_models(self.deployer.public)
        waiting = [
            r
            for r in records
            if r.state == "candidate" and any(d.action == "wait" for d in r.decisions)
        ]
        if not waiting:
            return None
        # The live model may have changed since they were validated: the seed's regression
        # rule is applied again against it (both validations are recorded: no new run).
        split, _ = await self.registry.get_split(self.deployer.public)
        live = await self.registry.get_model(split.live) if split and split.live else None
        newest = None
        for r in sorted(waiting, key=lambda r: r.version, reverse=True):
            why = None
            if newest is None and live is not None:
                why = regression_vs_live(
                    r.validation_details, live.validation_details, self.settings
                )
            if newest is None and why is None:
                newest = r
                continue
            await self.registry.transition(
                r.model_id,
                "rejected" if why else "retired",
                by=BY,
                action="reject" if why else "supersede",
                reason=(
                    f"validation failed against {live.model_id if live else 'live'}, live since "
                    f"this candidate was validated: {why}"
                    if why
                    else f"superseded by {newest.model_id if newest else '?'} before it was deployed"
                ),
            )
        if newest is None:
            return self._did("reject_waiting")
        try:
            await self.deployer.start(
                newest.model_id, self.plan, by=BY, reason="validated earlier; waited its turn"
            )
        except DeployError as exc:
            log.info("waiting candidate %s not deployed: %s", newest.model_id, exc)
            return None
        return self._did("deploy_waiting")

    def _did(self, action: str) -> str:
        self.last_action = (time.time(), action)
        return action

    async def run(self, stop: asyncio.Event) -> None:
        period = self.plan.analysis.period_s
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("monitor tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), period)


def _base_spec(ckpt: str, cache_dir: Path) -> dict[str, Any] | None:
    """How the checkpoint's base was built (agentrl_base.json), for the local backend."""
    from agentrl.deploy.backends import fetch_checkpoint
    from agentrl.llm.loading import BASE_FILE

    try:
        path = fetch_checkpoint(ckpt, cache_dir) / BASE_FILE
        return json.loads(path.read_text()) if path.exists() else None
    except Exception:
        return None
