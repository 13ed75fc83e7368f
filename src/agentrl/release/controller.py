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
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl.observability import instrument as obs
from agentrl.release.actions import Deployer, checkpoint_sha
from agentrl.release.monitor import RewardTracker, Summary, analyse
from agentrl.release.sequential import CheckResult
from agentrl.release.validation import benchmark_mean, best_waiting, regression_vs_live
from agentrl.serving.config import DeploySettings, RolloutPlan
from agentrl.serving.errors import DeployError
from agentrl.serving.registry import ModelRecord, Rollout

log = logging.getLogger(__name__)

BY = "agentrl-deploy-controller"
LISTING_AGE_S = 1.0  # the registry listing every lineage's look shares (serving reports)
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
        self.report_max_age_s = 15.0  # a gateway's serving report older than this is gone
        # (deployment_id, step) -> when a gateway first reported serving the new version at
        # that step: the step's clock (its pause and the inconclusive deadline) starts there,
        # not at the deploy, so a version whose adapter loads slowly is never judged on
        # traffic it never got. In memory: a restarted controller starts the clock again at
        # its first look (it waits longer, never shorter).
        self._served_at: dict[tuple[str, int], float] = {}
        # the controller lease (`agentrl.release.service.run_elected`); None: the only one
        self.lease: Any = None
        # its lineage is paused (`agentrl.release.fleet`): nothing new is deployed, the
        # running rollout holds where it is
        self.halted = False
        # whether a validated candidate may be waiting for its turn: set at start (a new
        # leader looks once) and whenever one is told to wait; an idle look then costs no
        # listing of the registry (100 idle lineages listed every model each look)
        self._maybe_waiting = True

    def active(self) -> bool:
        """Whether this controller may act now (it holds the lease, or there is none)."""
        return self.lease is None or bool(self.lease.held)

    # ---- training -> candidate ----------------------------------------------------------
    async def handle_status(self, event: Any) -> ModelRecord | None:
        if event.status != "completed":
            return None
        if not self.active():  # the lease passed on meanwhile: the active one handles it
            from agentrl.bus import TransientError

            raise TransientError("this deployment controller is not the active one")
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
            return await self._reject(
                record.model_id,
                f"{ckpt} is not a complete checkpoint (no manifest.json)",
            )
        return await self.validate_and_deploy(record)

    async def _reject(
        self, model_id: str, reason: str, evidence: dict[str, Any] | None = None
    ) -> ModelRecord:
        return await self.registry.transition(
            model_id, "rejected", by=BY, action="reject", reason=reason, evidence=evidence
        )

    async def _live(self) -> ModelRecord | None:
        split, _ = await self.registry.get_split(self.deployer.public)
        return await self.registry.get_model(split.live) if split and split.live else None

    async def validate_and_deploy(self, record: ModelRecord) -> ModelRecord:
        if self.validate is not None and self.settings.validate_models:
            live = await self._live()
            for _ in range(3):
                try:
                    results, details = await self.validate(record, live)
                except Exception as exc:
                    return await self._reject(
                        record.model_id,
                        f"validation could not run: {type(exc).__name__}: {exc}",
                    )

                def store(r: ModelRecord, res: Any = results, det: Any = details) -> None:
                    r.validation_results, r.validation_details = res, det

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
                    return await self._reject(
                        record.model_id,
                        f"validation failed: {reasons}",
                        {"validation_results": results},
                    )
                # A canary promoted while this one validated: the live model it was compared
                # with is not live any more (the loop's v5, validated against a 0.00 live
                # version, replaced v3 at 0.82). The regression rule again, against the new
                # live model's recorded validation; validated again when it has none.
                now = await self._live()
                if now is None or (live is not None and now.model_id == live.model_id):
                    break
                if now.validation_details.get("benchmark"):
                    why = regression_vs_live(details, now.validation_details, self.settings)
                    if why is None:
                        break
                    return await self._reject(
                        record.model_id,
                        f"validation failed against {now.model_id}, live since this "
                        f"candidate's validation began: {why}",
                        {"validation_results": results},
                    )
                live = now
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
                if self.halted:
                    raise DeployError(f"lineage {self.deployer.public} is paused")
                await self.deployer.start(record.model_id, self.plan, by=BY)
            except DeployError as exc:
                self._maybe_waiting = True
                await self.registry.record(
                    record.model_id,
                    by=BY,
                    action="wait",
                    reason=f"not deployed yet: {exc}",
                    evidence={},
                )
        return await self.registry.require_model(record.model_id)

    # ---- monitor ------------------------------------------------------------------------
    async def _reference_live(self) -> None:
        """`benchmark_live_early`: a live version with no recorded benchmark is benchmarked
        now, in the background (`Validator.start_reference`), not after the next candidate's
        trigger beside it."""
        start = getattr(self.validate, "start_reference", None)
        if start is None or not (
            self.settings.benchmark_live_early and self.settings.validate_models
        ):
            return
        live = await self._live()
        if live is not None and not live.validation_details.get("benchmark"):
            start(live)

    def _counts(self, model_id: str | None) -> tuple[int, int]:
        s = self.stats.get(model_id) if model_id else None
        return (s.requests, s.errors) if s is not None else (0, 0)

    async def tick(self) -> str | None:
        """One look at the rollout; returns what was done (or None).

        A promote or rollback found half-done is finished first. A step advances, and the
        last one promotes, only when its pause has passed, every check passed (at least
        `min_samples` per version on both sides) and a gateway serves the new version;
        otherwise it holds, and a step still undecided `inconclusive_deadline_s` after its
        pause (counted from the first serving report), or never served at all
        `unserved_deadline_s` into the step, is rolled back or handed to a human
        (`on_inconclusive`)."""
        if not self.active():
            return "standby"
        if self.halted:
            return "paused"
        self.ticks = [*self.ticks[-999:], time.time()]
        pending = await self.registry.get_rollout(self.deployer.public)
        if pending is not None and pending.status in ("promoting", "rolling_back"):
            action = "finish_promote" if pending.status == "promoting" else "finish_rollback"
            await self.deployer.complete_pending(by=BY)
            return self._did(action)
        rollout = pending
        if rollout is None or rollout.status != "running":
            await self._reference_live()
            return await self.deploy_waiting()
        if rollout.paused:
            return "paused"
        await self.deployer.reconcile(rollout)
        new, live = rollout.model_id, rollout.previous_model
        since = rollout.started_at.timestamp()  # rewards carry their stream arrival time
        if rollout.deployment_id not in self._baselines:
            # first look at this rollout in this process (a restart, or a new rollout): the
            # rewards since it began are read back from the streams, not lost with memory
            if self.deployer.bus is not None:
                await self.tracker.rebuild(self.deployer.bus, since)
            self._baselines = {
                rollout.deployment_id: (time.time(), {v: self._counts(v) for v in (new, live) if v})
            }
        _, base = self._baselines[rollout.deployment_id]

        def summary(v: str | None) -> Summary:
            if v is None:
                return Summary()
            req, err = self._counts(v)
            b_req, b_err = base.get(v, (0, 0))
            s = self.tracker.sessions(v, since)  # one reward per trajectory, per session
            obs.deployment(rewards={v: s.reward_sum / s.rewards} if s.rewards else None)
            return s.with_errors(req - b_req, err - b_err)

        plan = rollout.plan
        step = plan.steps[rollout.step]
        elapsed = time.time() - rollout.step_started_at.timestamp()
        checks: list[CheckResult] = []
        amounts: dict[str, dict[str, int]] = {}
        if live is None:
            verdict = "pass"
        else:
            s_new, s_live = summary(new), summary(live)
            verdict, checks = analyse(s_new, s_live, plan.analysis)
            amounts = {"new": _amount(s_new), "live": _amount(s_live)}
        evidence = {
            "verdict": verdict,
            "deployment_id": rollout.deployment_id,
            "step": rollout.step,
            "weight": step.weight,
            "checks": [c.to_dict() for c in checks],
            "evidence": amounts,
            "step_elapsed_s": round(elapsed, 3),
        }
        try:
            return await self._decide(rollout, verdict, checks, evidence, elapsed)
        except DeployError as exc:  # the rollout changed under us (a human, the gateway)
            log.info("monitor: no action on %s: %s", new, exc)
            return "hold"

    async def _decide(
        self,
        rollout: Rollout,
        verdict: str,
        checks: list[CheckResult],
        evidence: dict[str, Any],
        elapsed: float,
    ) -> str:
        plan, new = rollout.plan, rollout.model_id
        step = plan.steps[rollout.step]
        public = self.deployer.public
        if verdict == "fail":
            failures = rollout.failures + 1
            if failures >= plan.analysis.failure_threshold:
                why = "; ".join(f"{c.metric}: {c.reason}" for c in checks if c.verdict == "fail")
                await self.deployer.rollback(
                    by=BY,
                    reason=f"analysis failed: {why}",
                    evidence=evidence,
                    model_id=new,
                    automatic=True,
                )
                return self._did("rollback")

            def count(r: Rollout) -> None:
                if r.deployment_id == rollout.deployment_id and r.step == rollout.step:
                    r.failures = max(r.failures, failures)

            await self.registry.update_rollout(public, count)
        served = await self._served(new, step.weight)
        evidence["served_by"] = served
        key_step = (rollout.deployment_id, rollout.step)
        if served and key_step not in self._served_at:
            self._served_at = {
                k: v for k, v in self._served_at.items() if k[0] == rollout.deployment_id
            }
            self._served_at[key_step] = time.time()
        first_served = self._served_at.get(key_step)
        # the step's clock: from the first serving report (never before the step began)
        served_s = (
            time.time() - max(first_served, rollout.step_started_at.timestamp())
            if first_served is not None
            else None
        )
        evidence["served_s"] = None if served_s is None else round(served_s, 3)
        ready = served_s is not None and served_s >= step.pause_s
        # a 0 % step (blue_green's warm-up) has no traffic to judge: it is done once a
        # gateway has the version ready and nothing failed
        judged = verdict == "pass" or (step.weight == 0 and verdict != "fail")
        if ready and judged and served:
            text = _verdict_text(verdict, checks)
            if rollout.step + 1 < len(plan.steps):
                if not await self._advance_recorded(rollout):  # not by a controller that died
                    await self.registry.record(
                        new,
                        by=BY,
                        action="advance",
                        reason=f"step {rollout.step + 1} held {elapsed:.1f}s; {text}",
                        evidence=evidence,
                    )
                await self.deployer.set_step(
                    rollout, rollout.step + 1, by=BY, reason=f"analysis {verdict}"
                )
                return self._did("advance")
            await self.deployer.promote(
                new, by=BY, reason=f"every step passed its analysis; {text}", evidence=evidence
            )
            return self._did("promote")
        why = _verdict_text(verdict, checks)
        if not served:
            why += f"; no gateway serves {new}" + (" yet" if step.weight > 0 else " (not ready)")
            if served_s is None:
                why += f" ({elapsed:.0f}s since the step began: the step's clock has not started)"
        # never served at this step: the inconclusive deadline does not run (the version had
        # no traffic to judge), but the wait for a gateway to serve it is bounded
        over = (
            -1.0
            if served_s is None
            else served_s - step.pause_s - plan.analysis.inconclusive_deadline_s
        )
        unserved = served_s is None and elapsed >= plan.analysis.unserved_deadline_s
        if (ready and verdict != "fail" and over >= 0) or unserved:
            if unserved:
                waited = (
                    f"never served: no gateway served it {elapsed:.0f}s into step "
                    f"{rollout.step + 1} (deadline {plan.analysis.unserved_deadline_s:g}s)"
                )
            else:
                limit = plan.analysis.inconclusive_deadline_s
                waited = (
                    f"undecided {served_s:.0f}s after a gateway first served it in step "
                    f"{rollout.step + 1} (pause {step.pause_s:g}s + deadline {limit:g}s)"
                )
            if plan.analysis.on_inconclusive == "rollback":
                await self.deployer.rollback(
                    by=BY,
                    reason=f"analysis {waited}: {why}",
                    evidence=evidence,
                    model_id=new,
                    automatic=True,
                )
                return self._did("rollback")
            if not rollout.escalated:

                def escalate(r: Rollout) -> None:
                    if r.deployment_id == rollout.deployment_id:
                        r.escalated = True

                await self.registry.update_rollout(public, escalate)
                await self.registry.record(
                    new,
                    by=BY,
                    action="escalate",
                    reason=f"analysis {waited}: {why}; a human must promote or roll back",
                    evidence=evidence,
                )
                return self._did("escalate")
            return "hold"
        holding = _holding(rollout, evidence, first_served)
        evidence["holding"] = holding
        why = f"{holding['text']}; analysis {why}"
        # a hold is recorded when the verdict changes, and as the new version's evidence
        # doubles (1, 2, 4, 8 ... sessions): its last record says where the canary stands
        grown = int(math.log2(1 + evidence.get("evidence", {}).get("new", {}).get("sessions", 0)))
        key = {"verdict": verdict, "served": bool(served), "evidence": grown}
        if rollout.last_check != key:

            def note(r: Rollout) -> None:
                if r.deployment_id == rollout.deployment_id:
                    r.last_check = key

            await self.registry.update_rollout(public, note)
            await self.registry.record(new, by=BY, action="hold", reason=why, evidence=evidence)
        return "hold"

    async def _advance_recorded(self, rollout: Rollout) -> bool:
        """Whether this step's advance is already recorded: a controller that recorded it
        and died before moving the rollout (its successor moves it, without a second
        record)."""
        record = await self.registry.get_model(rollout.model_id)
        return record is not None and any(
            d.action == "advance"
            and d.evidence.get("deployment_id") == rollout.deployment_id
            and d.evidence.get("step") == rollout.step
            for d in record.decisions
        )

    async def _served(self, model_id: str, weight: float) -> list[str]:
        """The gateways that route traffic to `model_id` now (at a 0 % step: that have it
        ready). Without any report nothing is served: the controller holds. The reports'
        keys come from the listing every lineage's look shares; when it shows no gateway
        serving the version, the bucket is listed afresh (a gateway that just reported)."""
        for age in (LISTING_AGE_S, 0.0):
            reports = await self.registry.serving_reports(
                self.deployer.public, self.report_max_age_s, listing_age_s=age
            )
            if weight > 0:
                found = [r.gateway for r in reports if r.weights.get(model_id, 0.0) > 0]
            else:
                found = [r.gateway for r in reports if model_id in r.loaded]
            if found:
                return found
        return []

    async def deploy_waiting(self) -> str | None:
        """No rollout running: deploy the best validated candidate that had to wait for the
        previous rollout (`best_waiting`: the newest unless an older one scored better on
        the benchmark by more than its resolution); the other waiting ones are superseded,
        and any that regresses against a model that went live since it was validated is
        rejected."""
        if not self.settings.auto_deploy or not self._maybe_waiting:
            return None
        self._maybe_waiting = False  # set again by a wait recorded meanwhile
        records = await self.registry.list_models(self.deployer.public)
        waiting = [
            r
            for r in records
            if r.state == "candidate" and any(d.action == "wait" for d in r.decisions)
        ]
        if not waiting:
            return None
        self._maybe_waiting = True  # until one of them is deployed (or none can be)
        # The live model may have changed since they were validated: the seed's regression
        # rule is applied again against it (both validations are recorded: no new run).
        live = await self._live()
        why = {
            r.model_id: regression_vs_live(
                r.validation_details, live.validation_details, self.settings
            )
            if live is not None
            else None
            for r in waiting
        }
        fit = [r for r in waiting if why[r.model_id] is None]
        chosen = best_waiting(fit, self.settings) if fit else None
        for r in sorted(waiting, key=lambda r: r.version, reverse=True):
            if r is chosen:
                continue
            reason = why[r.model_id]
            await self.registry.transition(
                r.model_id,
                "rejected" if reason else "retired",
                by=BY,
                action="reject" if reason else "supersede",
                reason=(
                    f"validation failed against {live.model_id if live else 'live'}, live since "
                    f"this candidate was validated: {reason}"
                    if reason
                    else f"superseded by {_scored(chosen)} (this one "
                    f"{_scored(r, name=False)}) before it was deployed"
                ),
            )
        if chosen is None:
            return self._did("reject_waiting")
        reason = "validated earlier; waited its turn"
        if len(fit) > 1:
            reason += f" ({_scored(chosen, name=False)}, chosen among {len(fit)} waiting)"
        try:
            await self.deployer.start(chosen.model_id, self.plan, by=BY, reason=reason)
        except DeployError as exc:
            log.info("waiting candidate %s not deployed: %s", chosen.model_id, exc)
            return None
        self._maybe_waiting = False  # the others were superseded or rejected above
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


def _scored(r: ModelRecord | None, name: bool = True) -> str:
    """A candidate and its benchmark mean, for a decision's reason."""
    if r is None:
        return "?"
    mean = benchmark_mean(r.validation_details)
    score = "no benchmark" if mean is None else f"benchmark {mean:.3f}"
    return f"{r.model_id}, {score}" if name else score


def _amount(s: Summary) -> dict[str, int]:
    """How much evidence a version has: requests, rewarded episodes and their sessions."""
    return {"requests": s.requests, "episodes": s.rewards, "sessions": s.sessions}


def _holding(
    rollout: Rollout, evidence: dict[str, Any], first_served: float | None
) -> dict[str, Any]:
    """The status of a held step and its deadline rule, in words and fields.

    The rule: a step's clock starts when a gateway first serves the new version at it; the
    step holds at its weight while evidence accumulates; once its pause and then
    `inconclusive_deadline_s` have passed on that clock without a verdict, `on_inconclusive`
    applies (rolled back, or handed to a human); a step no gateway serves within
    `unserved_deadline_s` of its start is treated the same."""
    plan = rollout.plan
    a = plan.analysis
    step = plan.steps[rollout.step]
    if first_served is not None:
        start = max(first_served, rollout.step_started_at.timestamp())
        deadline = start + step.pause_s + a.inconclusive_deadline_s
    else:
        deadline = rollout.step_started_at.timestamp() + a.unserved_deadline_s
    then = "rolled back" if a.on_inconclusive == "rollback" else "handed to a human"
    amounts = evidence.get("evidence") or {}
    have = "; ".join(
        f"{side} {v['episodes']} episodes in {v['sessions']} sessions, {v['requests']} requests"
        for side, v in amounts.items()
    )
    text = (
        f"holding at {step.weight:g} % (step {rollout.step + 1}) while evidence accumulates"
        + (
            f" ({have}; a verdict needs {a.min_samples} episodes in {a.min_sessions} sessions"
            " per version)"
            if have
            else ""
        )
        + f"; still undecided at {_iso(deadline)} it is {then}"
    )
    return {
        "weight": step.weight,
        "deadline_at": _iso(deadline),
        "deadline_in_s": round(deadline - time.time(), 1),
        "on_deadline": a.on_inconclusive,
        "text": text,
    }


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _verdict_text(verdict: str, checks: list[CheckResult]) -> str:
    """The verdict as it is, with each check's own reason (kept in every decision)."""
    if not checks:
        return f"{verdict} (no live version to compare with)"
    return f"{verdict} (" + "; ".join(f"{c.metric} {c.verdict}: {c.reason}" for c in checks) + ")"


def _base_spec(ckpt: str, cache_dir: Path) -> dict[str, Any] | None:
    """How the checkpoint's base was built (agentrl_base.json), for the local backend."""
    from agentrl.llm.names import BASE_FILE
    from agentrl.serving.backends import fetch_checkpoint

    try:
        path = fetch_checkpoint(ckpt, cache_dir) / BASE_FILE
        return json.loads(path.read_text()) if path.exists() else None
    except Exception:
        return None
