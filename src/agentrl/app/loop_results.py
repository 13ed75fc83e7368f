"""The loop's results: one row per version, the run's figures, the table and the JSON line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.app.loop_agents import Watch


@dataclass
class VersionRow:
    model_id: str
    state: str
    heldout_success: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    heldout_n: int = 0
    per_family: dict[str, tuple[int, int]] = field(default_factory=dict)  # family: (wins, n)
    unseen_success: float | None = None  # tool use: the unseen-phrasing pool
    unseen_n: int = 0
    mean_reward: float | None = None
    rewards: int = 0
    traffic_share: float = 0.0
    decision: str = ""
    why: str = ""
    # not served at the end (rejected by validation, rolled back and unloaded): loaded for
    # the held-out evaluation only, with no traffic share
    held_for_eval: bool = False


@dataclass
class LoopResult:
    versions: list[VersionRow] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    trajectories: int = 0
    rewards: int = 0
    lost: int = 0
    mixed: int = 0  # trajectories played by more than one version (credited to none)
    heldout_errors: int = 0  # held-out episodes that ended on an error (left out of the figures)
    wall_s: float = 0.0
    report: str | None = None
    gateway_errors: int = 0
    start_model: str | None = None  # the version the agents began acting with
    loop_wall_s: float | None = None  # first trajectory to last promotion
    extra: dict[str, Any] = field(default_factory=dict)  # env-specific keys (tool use)
    # tool use: each evaluated version's held-out rows (`loop_tooluse_heldout.task_row`)
    task_rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        base = next((v for v in self.versions if v.model_id.endswith("-base")), None)
        served = [v for v in self.versions if v.heldout_success is not None and not v.held_for_eval]
        best = max(served, key=lambda v: v.heldout_success or 0.0, default=None)
        # promoted by the loop's own generations (a warm start is promoted by hand)
        promoted = [
            v for v in self.versions if v.decision == "promote" and v.model_id != self.start_model
        ]
        trained = max(promoted, key=lambda v: v.heldout_success or 0.0, default=None)
        # none promoted: the best evaluated version, unless that is the warm start itself
        chosen = trained or (best if best and best.model_id != self.start_model else None)
        live = self._live()
        return {
            "versions": len(self.versions),
            "promoted": len(promoted),
            "rolled_back": sum(v.decision == "rollback" for v in self.versions),
            "base_heldout_success": base.heldout_success if base else None,
            "best_heldout_success": best.heldout_success if best else None,
            "trained_heldout_success": chosen.heldout_success if chosen else None,
            "live_heldout_success": live.heldout_success if live else None,
            "heldout_seeds": max((v.heldout_n for v in served), default=0),
            "trajectories": self.trajectories,
            "rewards": self.rewards,
            "lost": self.lost,
            "mixed_trajectories": self.mixed,
            "heldout_errors": self.heldout_errors,
            "wall_s": round(self.wall_s, 1),
            **self._start_and_families(live),
            **self._candidate(),
            **self.extra,
            **self.task_figures(),
        }

    def _live(self) -> VersionRow | None:
        return next((v for v in self.versions if v.state == "live"), None)

    def _best_trained(self) -> VersionRow | None:
        """The best trained version by held-out success, served or not (`_candidate`)."""
        trained = [
            v
            for v in self.versions
            if v.heldout_success is not None
            and v.model_id != self.start_model
            and not v.model_id.endswith("-base")
        ]
        return max(trained, key=lambda v: v.heldout_success or 0.0, default=None)

    def task_figures(self) -> dict[str, Any]:
        """Tool use: the candidate and live version paired against the start task by task,
        and each one's first tool per family (`loop_tooluse_heldout.figures`); none without
        per-task rows (FrozenLake, a lineage)."""
        if not self.task_rows:
            return {}
        from agentrl.app.loop_tooluse_heldout import figures

        best, live = self._best_trained(), self._live()
        return figures(
            self.task_rows,
            self.start_model,
            best.model_id if best else None,
            live.model_id if live else None,
        )

    def _candidate(self) -> dict[str, Any]:
        """The best trained version's held-out, whether promoted or not (a rejected one is
        loaded for the evaluation only): whether a job learned, apart from the decisions."""
        best = self._best_trained()
        out: dict[str, Any] = {
            "candidate_model": best.model_id if best else None,
            "candidate_state": best.state if best else None,
            "candidate_heldout_success": best.heldout_success if best else None,
            "candidate_ci_low": best.ci_low if best else None,
            "candidate_ci_high": best.ci_high if best else None,
        }
        for fam, (wins, n) in (best.per_family if best else {}).items():
            out[f"candidate_{fam}_success"] = round(wins / n, 4) if n else None
        if any(v.unseen_n for v in self.versions):
            out["unseen_candidate_success"] = best.unseen_success if best else None
        return out

    def _start_and_families(self, live: VersionRow | None) -> dict[str, Any]:
        """The loop's own contribution: the version it began with against the live one at
        the end, and held-out success per task family (tool use)."""
        start = next((v for v in self.versions if v.model_id == self.start_model), None)
        out: dict[str, Any] = {
            "start_model": self.start_model,
            "start_heldout_success": start.heldout_success if start else None,
            "start_ci_high": start.ci_high if start else None,
            "live_ci_low": live.ci_low if live else None,
            "loop_wall_s": round(self.loop_wall_s, 1) if self.loop_wall_s is not None else None,
        }
        for row, name in ((start, "start"), (live, "live")):
            for fam, (wins, n) in (row.per_family if row else {}).items():
                out[f"{name}_{fam}_success"] = round(wins / n, 4) if n else None
            if any(v.unseen_n for v in self.versions):
                out[f"unseen_{name}_success"] = row.unseen_success if row else None
        return out


def decision_of(record: Any) -> tuple[str, str]:
    """The version's last deciding action and its reason (register/validate/advance skipped)."""
    for d in reversed(record.decisions):
        if d.action in (
            "promote",
            "rollback",
            "reject",
            "supersede",
            "bootstrap",
            "refuse_to_serve",
        ):
            return d.action, d.reason
    if record.decisions:
        d = record.decisions[-1]
        return d.action, d.reason
    return "", ""


def model_of(watch: Watch, tid: str) -> str | None:
    got = watch.rewards.get(tid)
    if not got:
        return None
    ev = got[max(got)]
    meta = ev.metadata
    model = getattr(meta, "model", None) if meta is not None else None
    if model is None and meta is not None:
        model = (getattr(meta, "model_extra", None) or {}).get("model")
    return str(model) if model else None


def median(xs: list[float]) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[len(s) // 2]


def job_stages(watch: Watch, stages: dict[str, float]) -> None:
    """Training wall time per job: first status to completed (from the events' timestamps)."""
    spans = []
    for evs in watch.statuses.values():
        done = [e for e in evs if e.status in ("completed", "failed", "cancelled")]
        if done:
            spans.append((done[-1].timestamp - evs[0].timestamp).total_seconds())
    stages["training_jobs"] = float(len(spans))
    stages["training_per_job"] = sum(spans) / len(spans) if spans else 0.0
    # inside a job, per job (its completed status's `stages_s`): hint sampling, RL steps,
    # replay, hint training, save
    parts: dict[str, list[float]] = {}
    for evs in watch.statuses.values():
        done = [e for e in evs if e.status == "completed"]
        meta = (done[-1].metadata.model_extra or {}) if done and done[-1].metadata else {}
        for k, v in (meta.get("stages_s") or {}).items():
            parts.setdefault(k, []).append(float(v))
    for k, vs in parts.items():
        stages[f"job_{k}"] = sum(vs) / len(vs)


def deploy_stages(records: list[Any], stages: dict[str, float]) -> None:
    """Validation (register -> validated/rejected) and canary (first step -> promote or
    rollback) per version, from the registry's audit trail."""
    val, canary, queued, unserved = [], [], [], []
    for r in records:
        at = {d.action: d.at for d in r.decisions}
        first: dict[str, Any] = {}
        for d in r.decisions:
            first.setdefault(d.action, d.at)
        reg = first.get("register")
        end_val = first.get("validate") or first.get("reject")
        if reg and end_val:
            val.append((end_val - reg).total_seconds())
        # the canary from its first step (a validated version that waited for the running
        # rollout counts that wait apart: `canary_queue_per_version`)
        start = first.get("set_weight") or first.get("deploy") or first.get("set_step")
        end = at.get("promote") or at.get("rollback")
        if start and end:
            canary.append((end - start).total_seconds())
            if end_val and start > end_val:
                queued.append((start - end_val).total_seconds())
            # deploy -> the first decision that saw a gateway serve it (the adapter's load)
            seen = next(
                (d.at for d in r.decisions if d.at >= start and d.evidence.get("served_by")),
                None,
            )
            if seen is not None:
                unserved.append((seen - start).total_seconds())
    stages["validation_per_version"] = sum(val) / len(val) if val else 0.0
    stages["canary_per_version"] = sum(canary) / len(canary) if canary else 0.0
    stages["canary_queue_per_version"] = sum(queued) / len(queued) if queued else 0.0
    stages["canary_unserved_per_version"] = sum(unserved) / len(unserved) if unserved else 0.0


def table(result: LoopResult) -> str:
    lines = [
        f"{'version':<22} {'state':<12} {'held-out success [95% CI]':<28} "
        f"{'mean reward':>11} {'traffic':>8}  decision: why",
    ]
    for v in result.versions:
        ho = (
            f"{v.heldout_success:.2f} [{v.ci_low:.2f}, {v.ci_high:.2f}] n={v.heldout_n}"
            if v.heldout_success is not None
            else "not served"
        )
        if v.held_for_eval:
            ho += " (loaded to evaluate)" if v.heldout_success is not None else " (unloadable)"

        mr = f"{v.mean_reward:+.3f}" if v.mean_reward is not None else "-"
        lines.append(
            f"{v.model_id:<22} {v.state:<12} {ho:<28} {mr:>11} {v.traffic_share:>7.0%}  "
            f"{v.decision}: {v.why[:90]}"
        )
        if v.per_family:
            fams = "  ".join(f"{f} {w}/{n} = {w / n:.2f}" for f, (w, n) in v.per_family.items())
            lines.append(f"{'':<22} per family: {fams}")
        if result.task_rows.get(v.model_id):
            from agentrl.app.loop_tooluse_heldout import first_tool_line

            lines.append(f"{'':<22} first tool: {first_tool_line(result.task_rows[v.model_id])}")
    if result.task_rows:
        from agentrl.app.loop_tooluse_heldout import describe

        lines.extend(describe(result.task_figures()))
    lines.append(
        f"trajectories played by more than one version (credited to none): {result.mixed} "
        f"of {result.trajectories}"
    )
    if result.stages:  # a lineage's table has none: the run's stages are in its JSON line
        lines.append("")
        lines.append(
            "stage wall times (s): " + ", ".join(f"{k}={v}" for k, v in result.stages.items())
        )
    return "\n".join(lines)
