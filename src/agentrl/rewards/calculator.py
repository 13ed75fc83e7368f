"""The reward calculator: components -> normalisation -> totals -> the reward payload.

Pure: it takes trajectories with their code evidence, custom-function results and feedback,
plus the window state, and returns reward events and the next window state. The service does
the I/O (bus, tools, storage) around it.

Totals (documented in docs/guide/rewards.md):
  raw        = sum(w_i x s_i) / sum(w_i) over the components that apply (weights 0.4/0.2/0.15/
               0.25 with all four present give the seed's worked example, 0.8775), so a
               trajectory without code is not capped at 0.85;
  normalized = sum(w_i x z_i), z_i = (s_i - mean_i) / (std_i + 1e-8) over the trailing window
               of component i including this score; a component that does not apply gives 0,
               as the seed says.
`total_reward` is one of the two (config `total_reward`, default raw) and
`normalization.total_reward_kind` says which.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import pydantic_core

from agentrl.contracts.base import utcnow
from agentrl.contracts.reward import COMPONENT_SOURCES, SOURCE_OF_KIND, RewardEvent
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.rewards import components as C
from agentrl.rewards.config import PartialCreditConfig, RewardConfig
from agentrl.rewards.custom import EvaluateResult
from agentrl.rewards.window import WindowState

EPS = 1e-8
TOTAL = "__total__"  # the window of raw totals behind the `normalization` block
REWARD_NAMESPACE = uuid.UUID("6c1f1a52-2f3e-4d0b-9a55-6a0e1d6b7e11")


def reward_id(trajectory_id: str, calculator_version: str, version: int) -> str:
    """Deterministic: the same trajectory scored by the same calculator gives the same id,
    so a redelivered trajectory is de-duplicated by JetStream (Nats-Msg-Id) and by consumers.

    It is uuid5(REWARD_NAMESPACE, "trajectory_id|calculator_version|version"), computed
    directly with hashlib (uuid.uuid5 is several times slower)."""
    name = f"{trajectory_id}|{calculator_version}|{version}".encode()
    h = bytearray(hashlib.sha1(_NS_BYTES + name).digest()[:16])
    h[6] = (h[6] & 0x0F) | 0x50  # version 5
    h[8] = (h[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = h.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


_NS_BYTES = REWARD_NAMESPACE.bytes


@dataclass
class ScoringInput:
    """One trajectory with everything its components need besides the windows."""

    trajectory: TrajectoryEvent
    code: C.CodeEvidence = field(default_factory=lambda: C.CodeEvidence(contains_code=False))
    custom: Mapping[str, EvaluateResult] = field(default_factory=dict)
    feedback: C.FeedbackState | None = None  # None: from the outcome block
    redactions: Mapping[str, int] = field(default_factory=dict)


class Scored:
    """One computed reward: the payload as a plain dict (serialised by pydantic-core's Rust
    JSON encoder, validated into a `RewardEvent` only when `.event` is asked for)."""

    __slots__ = ("_event", "_json", "payload")

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self._json: bytes | None = None
        self._event: RewardEvent | None = None

    @property
    def reward_id(self) -> str:
        return str(self.payload["reward_id"])

    @property
    def trajectory_id(self) -> str:
        return str(self.payload["trajectory_id"])

    @property
    def version(self) -> int:
        return int(_moved(self.payload, "metadata", "version"))

    def to_json(self) -> bytes:
        if self._json is None:
            # orjson: the same bytes as pydantic's encoder for these plain payloads, at a
            # third of its time; a value orjson cannot encode goes through pydantic's rules
            self._json = orjson.dumps(
                self.payload,
                default=pydantic_core.to_jsonable_python,
                option=orjson.OPT_NON_STR_KEYS,
            )
        return self._json

    @property
    def event(self) -> RewardEvent:
        """The payload checked against the `agent.rl.reward.v1` contract."""
        if self._event is None:
            self._event = RewardEvent.model_validate_json(self.to_json())
        return self._event

    def __repr__(self) -> str:
        return f"Scored({self.trajectory_id!r}, v{self.version}, total={self.payload['total_reward']:.4f})"


def score_trajectory(
    trajectory: TrajectoryEvent,
    state: WindowState | None = None,
    config: RewardConfig | None = None,
    **inputs: Any,
) -> tuple[RewardEvent, WindowState]:
    """Score one trajectory (see `score_batch`); returns the reward event and the next state."""
    config = config or RewardConfig()
    state = state or WindowState(config.window, config.efficiency_window)
    rewards, new_state = score_batch([ScoringInput(trajectory, **inputs)], state, config)
    return rewards[0].event, new_state


def score_batch(
    items: Sequence[ScoringInput],
    state: WindowState,
    config: RewardConfig,
    now: datetime | None = None,
) -> tuple[list[Scored], WindowState]:
    """Score a batch as if one at a time, in order; returns rewards and the next window state.

    The given `state` is not modified, so a caller whose commit fails keeps the old one.
    """
    stamp = (now or utcnow()).isoformat().replace("+00:00", "Z")
    cols = _Columns.of(config)
    scores = _Scores.without_history(items, cols, config)
    new_turns = _score_efficiency(items, scores.got, cols.k_of[C.EFFICIENCY], state, config)
    norm = _Normalised.of(scores.got, cols.names, state)
    raw_total, norm_total, partial = _totals(norm, cols, scores.credits)
    _, tot_mean, tot_std = state.component(TOTAL).batch_stats(raw_total, include_self=True)
    norm.new_values[TOTAL] = raw_total.tolist()
    rows = _Rows(
        cols,
        config,
        stamp,
        scores,
        partial,
        # NaN/inf -> 0.0 (JSON cannot carry them), as `_f` does, once per array
        *(_finite(a) for a in (norm.z, norm.mean, norm.std)),
        *(_finite(a) for a in (raw_total, norm_total, tot_mean, tot_std)),
    )
    out = [Scored(rows.payload(i, item)) for i, item in enumerate(items)]
    return out, state.updated(norm.new_values, new_turns)


@dataclass
class _Columns:
    """The batch's component columns: the configured weights in their order (partial
    credit's after the base ones), and which columns are partial credit's (they feed its
    bonus, not the base total)."""

    weights: dict[str, float]
    names: list[str]
    k_of: dict[str, int]
    is_partial: np.ndarray
    pcc: PartialCreditConfig | None

    @classmethod
    def of(cls, config: RewardConfig) -> _Columns:
        weights = config.component_weights()
        pcc = config.partial_credit
        if pcc is not None:
            weights.update(pcc.weights)
        names = list(weights)
        is_partial = np.array([pcc is not None and name in C.PARTIAL for name in names], dtype=bool)
        return cls(weights, names, {name: j for j, name in enumerate(names)}, is_partial, pcc)


@dataclass
class _Scores:
    """Per trajectory: each column's score (None: it does not apply), the custom functions'
    errors and step rows, the feedback and the partial credit (None when off)."""

    got: list[list[C.ComponentScore | None]] = field(default_factory=list)
    errors: list[list[dict[str, str]]] = field(default_factory=list)
    steps: list[dict[str, list[dict[str, Any]]]] = field(default_factory=list)
    feedback: list[C.FeedbackState] = field(default_factory=list)
    credits: list[C.PartialCredit | None] = field(default_factory=list)

    @classmethod
    def without_history(
        cls, items: Sequence[ScoringInput], cols: _Columns, config: RewardConfig
    ) -> _Scores:
        """The components that need no window: task completion, code quality, user
        feedback, partial credit and the custom functions (efficiency is left None)."""
        out = cls()
        k_of = cols.k_of
        j_tc, j_cq, j_uf = k_of[C.TASK_COMPLETION], k_of[C.CODE_QUALITY], k_of[C.USER_FEEDBACK]
        for item in items:
            traj = item.trajectory
            fb = item.feedback or C.FeedbackState.from_trajectory(traj)
            row: list[C.ComponentScore | None] = [None] * len(cols.names)
            row[j_tc] = C.task_completion(traj.outcome)
            row[j_cq] = C.code_quality(item.code)
            row[j_uf] = C.user_feedback(fb)
            credit = None
            if cols.pcc is not None:
                credit = C.partial_credit(traj)
                for name, cs in credit.components.items():
                    row[k_of[name]] = cs
            errors: list[dict[str, str]] = []
            steps: dict[str, list[dict[str, Any]]] = {}
            _custom_scores(item, config, row, k_of, errors, steps)
            out.got.append(row)
            out.errors.append(errors)
            out.steps.append(steps)
            out.feedback.append(fb)
            out.credits.append(credit)
        return out


def _custom_scores(
    item: ScoringInput,
    config: RewardConfig,
    row: list[C.ComponentScore | None],
    k_of: Mapping[str, int],
    errors: list[dict[str, str]],
    steps: dict[str, list[dict[str, Any]]],
) -> None:
    """The custom functions' results into `row`; one that failed or did not run is an
    error of the reward (its weight still counts against the confidence), not a score."""
    for spec in config.custom_functions:
        res = item.custom.get(spec.name)
        if res is None or res.error:
            errors.append(
                {
                    "component": spec.name,
                    "error": (res.error if res else None) or "reward function was not run",
                }
            )
            continue
        row[k_of[spec.name]] = C.ComponentScore(
            float(res.score),
            source="custom",
            reasoning=res.reason or "",
            metrics={m: r.model_dump(exclude_none=True) for m, r in res.metrics.items()},
        )
        if res.step_outputs:
            steps[spec.name] = [st.model_dump(exclude_none=True) for st in res.step_outputs]


def _score_efficiency(
    items: Sequence[ScoringInput],
    got: list[list[C.ComponentScore | None]],
    j_ef: int,
    state: WindowState,
    config: RewardConfig,
) -> dict[str, list[float]]:
    """Efficiency into column `j_ef`: each trajectory against the earlier ones of its
    domain (the window, then this batch in order); returns the turn counts to append."""
    by_domain: dict[str, list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        by_domain[item.trajectory.task_context.domain].append(i)
    new_turns: dict[str, list[float]] = {}
    for domain, idx in by_domain.items():
        turns = [float(len(items[i].trajectory.turns)) for i in idx]
        count, mean, std = state.domain(domain).batch_stats(turns, include_self=False)
        for q, i in enumerate(idx):
            got[i][j_ef] = C.efficiency(
                items[i].trajectory,
                float(count[q]),
                float(mean[q]),
                float(std[q]),
                config.efficiency_min_history,
                by_completion=config.efficiency_by_completion,
            )
        new_turns[domain] = turns
    return new_turns


@dataclass
class _Normalised:
    """The scores as (trajectory x column) arrays, with each score's z against its
    column's trailing window (this score included), and the values to append."""

    present: np.ndarray
    raw: np.ndarray
    z: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    new_values: dict[str, list[float]]

    @classmethod
    def of(
        cls, got: list[list[C.ComponentScore | None]], names: Sequence[str], state: WindowState
    ) -> _Normalised:
        n, k = len(got), len(names)
        present = np.array([[cs is not None for cs in row] for row in got], dtype=bool).reshape(
            n, k
        )
        raw = np.array(
            [[cs.score if cs is not None else 0.0 for cs in row] for row in got], dtype=np.float64
        ).reshape(n, k)
        z, win_mean, win_std = np.zeros((n, k)), np.zeros((n, k)), np.zeros((n, k))
        new_values: dict[str, list[float]] = {}
        for j, name in enumerate(names):
            rows = np.flatnonzero(present[:, j])
            if rows.size == 0:
                continue
            vals = raw[rows, j]
            _, mean, std = state.component(name).batch_stats(vals, include_self=True)
            z[rows, j] = (vals - mean) / (std + EPS)
            win_mean[rows, j] = mean
            win_std[rows, j] = std
            new_values[name] = vals.tolist()
        return cls(present, raw, z, win_mean, win_std, new_values)


def _totals(
    norm: _Normalised, cols: _Columns, credits: Sequence[C.PartialCredit | None]
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """(raw totals, normalised totals, partial credit's metadata per trajectory, [] when
    off): the weighted mean of the base components that apply, plus partial credit's bonus."""
    w_all = np.array([cols.weights[name] for name in cols.names], dtype=np.float64)
    w = np.where(cols.is_partial, 0.0, w_all)  # the base total: without the partial credit
    avail_w = norm.present @ w
    raw_total = np.where(
        avail_w > 0, (norm.raw * w).sum(axis=1) / np.where(avail_w > 0, avail_w, 1.0), 0.0
    )
    norm_total = (norm.z * w).sum(axis=1)
    if cols.pcc is None:
        return raw_total, norm_total, []
    bonus, bonus_norm, partial = _partial_bonus(norm, cols, cols.pcc, credits, w_all, w, avail_w)
    return raw_total + bonus, norm_total + bonus_norm, partial


def _partial_bonus(
    norm: _Normalised,
    cols: _Columns,
    pcc: PartialCreditConfig,
    credits: Sequence[C.PartialCredit | None],
    w_all: np.ndarray,
    w: np.ndarray,
    avail_w: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """Partial credit's bonus (raw and normalised) and its metadata per trajectory.

    P = the weighted fraction of the checklist. A trajectory that did not succeed adds
    cap x gain x P, gain = what succeeding would add to its base total (task completion
    from its score to 1: (1 - s) x w_tc / sum w; 1 where task completion does not count):
    so it stays below the same trajectory succeeded. A success adds 0."""
    present, raw = norm.present, norm.raw
    w_p = np.where(cols.is_partial, w_all, 0.0)
    avail_p = present @ w_p
    safe_p = np.where(avail_p > 0, avail_p, 1.0)
    p_raw = np.where(avail_p > 0, (raw * w_p).sum(axis=1) / safe_p, 0.0)
    p_norm = np.where(avail_p > 0, (norm.z * w_p).sum(axis=1) / safe_p, 0.0)
    won = np.array([c is not None and c.success is True for c in credits], dtype=bool)
    j_tc = cols.k_of[C.TASK_COMPLETION]
    counts = present[:, j_tc] & (w[j_tc] > 0)
    share_tc = w[j_tc] / np.where(avail_w > 0, avail_w, 1.0)
    gain_failed = np.where(counts, share_tc, 1.0)  # a failure's gain (per-turn scale)
    gain = np.where(counts, (1.0 - raw[:, j_tc]) * share_tc, 1.0)
    gain = np.where(won, gain_failed, gain)
    bonus = np.where(won, 0.0, pcc.cap * gain * p_raw)
    bonus_norm = np.where(won, 0.0, pcc.cap * gain * p_norm)
    partial: list[dict[str, Any]] = []
    for i, c in enumerate(credits):
        assert c is not None
        partial.append(
            _turn_credit(c, w_p, cols.names, present[i], float(avail_p[i]), pcc.cap * gain[i])
            | {
                "cap": pcc.cap,
                "gain": _f(float(gain[i])),
                "score": _f(float(p_raw[i])),
                "bonus": _f(float(bonus[i])),
                "normalized_bonus": _f(float(bonus_norm[i])),
                "success": bool(won[i]),
            }
        )
    return bonus, bonus_norm, partial


@dataclass
class _Rows:
    """What a batch's payloads are built from, as plain lists (finite: NaN/inf as 0.0)."""

    cols: _Columns
    config: RewardConfig
    stamp: str
    scores: _Scores
    partial: list[dict[str, Any]]
    z: list[list[float]]
    mean: list[list[float]]
    std: list[list[float]]
    raw_total: list[float]
    norm_total: list[float]
    total_mean: list[float]
    total_std: list[float]
    # read once per batch: `calculator_version` hashes the config; numpy's bools per
    # element cost as much as the rest of a row's loop
    calculator_version: str = field(init=False)
    columns: list[tuple[str, float, bool]] = field(init=False)

    def __post_init__(self) -> None:
        self.calculator_version = self.config.calculator_version
        weights = self.cols.weights
        self.columns = [
            (name, weights[name], bool(partial))
            for name, partial in zip(self.cols.names, self.cols.is_partial, strict=True)
        ]

    def payload(self, i: int, item: ScoringInput) -> dict[str, Any]:
        """Trajectory i's reward in its wire form (`_payload`, built without nulls)."""
        traj, config = item.trajectory, self.config
        kind = config.total_reward
        comps, meta = self._components(i), self._metadata(i, item)
        step_rows = _without_nulls(self.scores.steps[i]) if self.scores.steps[i] else {}
        if self.partial:
            pc_meta = self.partial[i]
            per_turn = pc_meta.pop("per_turn")
            step_rows["partial_credit"] = pc_meta.pop("rows")
            meta["partial_credit"] = pc_meta
            total = self.raw_total[i] if kind == "raw" else self.norm_total[i]
            meta["turn_rewards"] = turn_rewards_for(per_turn, total)
        return _payload(
            traj.trajectory_id,
            traj.session_id,
            self.stamp,
            comps,
            self.raw_total[i],
            self.norm_total[i],
            kind,
            version=1,
            calculator_version=self.calculator_version,
            normalization={
                "method": "z-score",
                "mean": self.total_mean[i],
                "std": self.total_std[i],
                "window": config.window,
                "scope": NORMALIZATION_SCOPE,
            },
            metadata=meta,
            step_rewards=step_rows,
            strip=False,
        )

    def _components(self, i: int) -> dict[str, Any]:
        """`reward_components` of trajectory i: the columns that scored, in column order."""
        comps: dict[str, Any] = {}
        row = zip(
            self.columns, self.scores.got[i], self.z[i], self.mean[i], self.std[i], strict=True
        )
        for (name, wj, _), cs, z, mean, std in row:
            if cs is None:
                continue
            # Built without nulls (the wire form has none): only user-supplied parts (a
            # custom function's metrics) go through the generic stripping.
            comp: dict[str, Any] = {"score": cs.score, "weight": wj, **_source(cs.source)}
            if cs.reasoning:
                comp["reasoning"] = cs.reasoning
            comp["normalized_score"] = z
            comp["window_mean"] = mean
            comp["window_std"] = std
            if cs.metrics:
                comp["metrics"] = (
                    _without_nulls(cs.metrics)
                    if cs.source == "custom"
                    else {k: v for k, v in cs.metrics.items() if v is not None}
                )
            comps[name] = comp
        return comps

    def _metadata(self, i: int, item: ScoringInput) -> dict[str, Any]:
        """Trajectory i's `metadata` before partial credit's: who scored, how confidently
        (the informative share of the applicable base weight), what did not apply."""
        traj, scores = item.trajectory, self.scores
        informative_w = applicable_w = 0.0
        not_applicable: list[str] = []
        errored = {e["component"] for e in scores.errors[i]}
        for (name, wj, partial), cs in zip(self.columns, scores.got[i], strict=True):
            if cs is None:
                if name in errored:
                    applicable_w += wj
                else:
                    not_applicable.append(name)
            elif not partial:  # confidence is the base total's
                applicable_w += wj
                if cs.informative:
                    informative_w += wj
        uf = scores.got[i][self.cols.k_of[C.USER_FEEDBACK]]
        human = uf is not None and uf.source in ("human", "implicit")
        meta: dict[str, Any] = {
            "evaluator": self.config.evaluator,
            "evaluation_method": "hybrid" if human else "automated",
            "confidence": round(informative_w / applicable_w, 4) if applicable_w > 0 else 0.0,
            "errors": scores.errors[i],
            "not_applicable": not_applicable,
            "redactions": dict(item.redactions),
            "feedback": {k: v for k, v in scores.feedback[i].to_dict().items() if v is not None},
            "domain": traj.task_context.domain,
        }
        if traj.metadata.model is not None:
            # the serving version (gateway's `model`): rewards are attributed per version
            meta["model"] = traj.metadata.model
        return meta


NORMALIZATION_SCOPE = "component z-scores are in reward_components.*.normalized_score; mean/std here are of raw totals"


def rescore_with_feedback(
    previous: dict[str, Any],
    feedback: C.FeedbackState,
    state: WindowState,
    config: RewardConfig,
    now: datetime | None = None,
) -> Scored:
    """The next version of a reward (its payload dict) after late user feedback.

    Only user_feedback changes; it is normalised against the current window (which late
    feedback does not enter: the window holds first scores, so replaying a stream gives the
    same statistics). Every other component keeps its score and normalised score.
    """
    stamp = (now or utcnow()).isoformat().replace("+00:00", "Z")
    cs = C.user_feedback(feedback)
    window = state.component(C.USER_FEEDBACK)
    mean, std = window.mean_std() if len(window) else (cs.score, 0.0)
    comps = {name: dict(c) for name, c in previous["reward_components"].items()}
    old = comps.get(C.USER_FEEDBACK)
    comps[C.USER_FEEDBACK] = {
        "score": cs.score,
        "weight": old["weight"] if old is not None else config.component_weights()[C.USER_FEEDBACK],
        **_source(cs.source),
        "reasoning": cs.reasoning,
        "normalized_score": _f((cs.score - mean) / (std + EPS)),
        "window_mean": _f(mean),
        "window_std": _f(std),
    }
    meta = dict(previous.get("metadata") or {})
    found = meta.get("partial_credit")
    pc: dict[str, Any] = found if isinstance(found, dict) else {}
    skip = set(pc.get("components") or ())  # partial credit enters as its stored bonus
    num = den = normed = 0.0
    for name, comp in comps.items():
        if name in skip:
            continue
        num += comp["weight"] * comp["score"]
        den += comp["weight"]
        normed += comp["weight"] * float(comp.get("normalized_score") or 0.0)
    raw_total = (num / den if den > 0 else 0.0) + float(pc.get("bonus") or 0.0)
    normed += float(pc.get("normalized_bonus") or 0.0)
    kind = _moved(previous, "normalization", "total_reward_kind") or config.total_reward
    old_turns = meta.get("turn_rewards")
    if isinstance(old_turns, list) and old_turns:
        meta["turn_rewards"] = turn_rewards_for(
            [float(x) for x in old_turns[:-1]] + [0.0], raw_total if kind == "raw" else normed
        )
    meta["feedback"] = feedback.to_dict()
    if cs.source in ("human", "implicit"):
        meta["evaluation_method"] = "hybrid"
    version = int(_moved(previous, "metadata", "version")) + 1
    return Scored(
        _payload(
            previous["trajectory_id"],
            previous["session_id"],
            stamp,
            comps,
            raw_total,
            normed,
            kind,
            version=version,
            calculator_version=_moved(previous, "metadata", "calculator_version")
            or config.calculator_version,
            normalization=previous.get("normalization"),
            metadata=meta,
            step_rewards=_moved(previous, "metadata", "step_rewards") or {},
            supersedes=previous["reward_id"],
        )
    )


def _turn_credit(
    credit: C.PartialCredit,
    w_p: np.ndarray,
    names: Sequence[str],
    present: np.ndarray,
    avail: float,
    cap: float,
) -> dict[str, Any]:
    """Where a trajectory's partial credit was earned: per turn, cap x sum(w_c x share) /
    sum(w_c), summing to cap x P (`step_rewards.partial_credit`, the custom functions' row
    format; built without nulls, so the payload's null stripping skips it)."""
    n = len(credit.turn_ids)
    per_turn = [0.0] * n
    if avail > 0:
        for j, name in enumerate(names):
            share = credit.shares.get(name)
            if share is None or not present[j] or w_p[j] <= 0:
                continue
            f = cap * float(w_p[j]) / avail
            for k in range(n):
                per_turn[k] += f * share[k]
    rows = [
        {"step_index": tid, "base_reward": _f(v)}
        for tid, v in zip(credit.turn_ids, per_turn, strict=True)
    ]
    return {"components": list(C.PARTIAL), "per_turn": per_turn, "rows": rows}


def turn_rewards_for(per_turn: Sequence[float], total: float) -> list[float]:
    """Per-turn rewards that sum to `total`: each turn's partial credit, and on the last turn
    what the total holds beyond the earlier turns' credit (the outcome's reward)."""
    if not per_turn:
        return []
    head = [_f(float(x)) for x in per_turn[:-1]]
    return [*head, _f(float(total) - sum(head))]


def _payload(
    trajectory_id: str,
    session_id: str,
    stamp: str,
    comps: dict[str, Any],
    raw: float,
    normed: float,
    kind: str,
    *,
    version: int,
    calculator_version: str,
    normalization: dict[str, Any] | None,
    metadata: dict[str, Any],
    step_rewards: Mapping[str, Any],
    supersedes: str | None = None,
    strip: bool = True,
) -> dict[str, Any]:
    """The `agent.rl.reward.v1` payload in its wire form (contracts.reward.RewardEvent): the
    seed's top-level fields only, agentrl's additions in `normalization` and `metadata`, no
    nulls (`strip=False`: the caller built every part without nulls already)."""
    norm = {"method": "none", **(normalization or {})}
    norm.update(raw_total_reward=raw, normalized_total_reward=normed, total_reward_kind=kind)
    meta = {**metadata, "version": version, "calculator_version": calculator_version}
    if step_rewards:
        meta["step_rewards"] = dict(step_rewards)
    if supersedes:
        meta["supersedes"] = supersedes
    payload: dict[str, Any] = {
        "reward_id": reward_id(trajectory_id, calculator_version, version),
        "trajectory_id": trajectory_id,
        "session_id": session_id,
        "timestamp": stamp,
        "reward_components": comps,
        "total_reward": raw if kind == "raw" else normed,
        "reward_type": "dense" if step_rewards else "sparse",
        "normalization": norm,
        "metadata": meta,
    }
    return _without_nulls(payload) if strip else payload


def _without_nulls(d: dict[str, Any]) -> dict[str, Any]:
    """`contracts.base.without_nulls` for the reward payload, without a call per leaf (the
    generic one was ~10 % of the service's time): only dicts and lists are descended into."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if v is None:
            continue
        t = type(v)
        if t is dict:
            v = _without_nulls(v)
        elif t is list:
            v = _list_without_nulls(v)
        out[k] = v
    return out


def _list_without_nulls(items: list[Any]) -> list[Any]:
    return [
        _without_nulls(x) if type(x) is dict else _list_without_nulls(x) if type(x) is list else x
        for x in items
    ]


def _moved(payload: Mapping[str, Any], block: str, key: str) -> Any:
    """A field of a stored reward payload, where it lives now or at its old top-level place."""
    nested = payload.get(block)
    if isinstance(nested, Mapping) and nested.get(key) is not None:
        return nested[key]
    return payload.get(key)


def _source(kind: str) -> dict[str, str]:
    """A component's `source` as the schema allows it; agentrl's finer kind in `source_kind`."""
    if kind in COMPONENT_SOURCES:
        return {"source": kind}
    return {"source": SOURCE_OF_KIND.get(kind, "automated"), "source_kind": kind}


def _finite(a: Any) -> Any:
    """`a.tolist()` with NaN/inf as 0.0 (what `_f` does to each element)."""
    return np.where(np.isfinite(a), a, 0.0).tolist()


def _f(x: float) -> float:
    """0.0 for NaN/inf, which JSON cannot carry."""
    return x if math.isfinite(x) else 0.0
