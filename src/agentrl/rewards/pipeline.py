"""Getting a batch of trajectories ready for the calculator: redact, find code, lint it,
run custom reward functions.

Shared by the reward service and offline scoring (`agentrl rewards score`), so both score the
same way. It runs tools (ruff, bandit, user functions) but knows nothing of the bus: a
trajectory it cannot prepare comes back as a `Failure` the caller turns into a dead letter
(permanent) or a retry (transient).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import pydantic_core
from pydantic import ValidationError

from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.core.errors import AgentRLError
from agentrl.rewards.calculator import Scored, ScoringInput, score_batch
from agentrl.rewards.code import (
    CodeChecker,
    ExtractedCode,
    SnippetReport,
    evidence_for,
    extract_code,
)
from agentrl.rewards.config import RewardConfig
from agentrl.rewards.custom import (
    EvaluateResult,
    RewardFunction,
    ground_truth_of,
    resolve,
    trajectory_messages,
)
from agentrl.rewards.redact import RedactionReport, Redactor
from agentrl.rewards.window import WindowState

log = logging.getLogger(__name__)


class ScoringError(AgentRLError):
    """A valid trajectory that the calculator cannot score (it is dead-lettered)."""


@dataclass
class Failure:
    kind: Literal["permanent", "transient"]
    reason: str


@dataclass
class PreparedBatch:
    inputs: dict[int, ScoringInput] = field(default_factory=dict)  # batch index -> input
    failures: dict[int, Failure] = field(default_factory=dict)
    counters: Counter[str] = field(default_factory=Counter)

    @property
    def order(self) -> list[int]:
        return sorted(self.inputs)


class Preparer:
    """Holds the redactor, the code checker and the resolved custom functions."""

    def __init__(
        self,
        config: RewardConfig,
        *,
        redactor: Redactor | None = None,
        checker: CodeChecker | None = None,
        functions: dict[str, RewardFunction] | None = None,
    ) -> None:
        self.config = config
        self.redactor = redactor or Redactor(config.pii_kinds)
        self.checker = checker or CodeChecker(config.lint_rules, config.lint_ignore)
        self.functions = (
            functions
            if functions is not None
            else {spec.name: resolve(spec.name, spec.module) for spec in config.custom_functions}
        )

    async def prepare(
        self,
        events: Sequence[TrajectoryEvent],
        raw: Sequence[bytes | None] | None = None,
        indices: Sequence[int] | None = None,
    ) -> PreparedBatch:
        """Prepare `events[i]` for i in `indices` (default all); `raw[i]` is the message's JSON
        (saves re-serialising for the PII pre-scan)."""
        out = PreparedBatch()
        idx = list(range(len(events))) if indices is None else list(indices)
        found: dict[int, tuple[TrajectoryEvent, ExtractedCode, dict[str, int]]] = {}
        datas: list[bytes] = []
        if self.config.redact:
            for i in idx:
                r = raw[i] if raw is not None else None
                datas.append(r if r is not None else events[i].to_json())
        # One pre-scan over the whole batch's bytes (equal to scanning each message).
        kinds: list[frozenset[str] | None] = [None] * len(datas)
        try:
            kinds = list(self.redactor.candidates_batch(datas))
        except Exception:  # an odd message must not fail the batch: scan one by one
            log.warning("batch PII pre-scan failed; scanning one by one", exc_info=True)
        for n, i in enumerate(idx):
            try:
                found[i] = self._one(
                    events[i],
                    datas[n] if datas else None,
                    kinds[n] if datas else None,
                    out.counters,
                )
            except Exception as exc:
                out.failures[i] = Failure(
                    "permanent",
                    f"cannot prepare trajectory for scoring: {type(exc).__name__}: {exc}",
                )

        # One ruff+bandit run for all the code of the batch (the checker isolates a snippet
        # that breaks the tools); should the checker itself fail, the code is scored as
        # unanalysable rather than failing (and finally dead-lettering) the whole batch.
        snippets = [s for i in found for s in found[i][1].python]
        reports: list[SnippetReport] = []
        if snippets:
            try:
                reports = await self.checker.check(snippets)
            except Exception as exc:
                log.warning("code checker failed: %s", exc, exc_info=True)
                out.counters["code_checker_failures"] += 1
                why = f"code checker failed: {type(exc).__name__}: {exc}"
                reports = [SnippetReport(0, 0, 0, 0, 0, 0, error=why) for _ in snippets]
        it = iter(reports)
        for i, (traj, code, redactions) in found.items():
            mine = [next(it) for _ in code.python]
            out.inputs[i] = ScoringInput(traj, code=evidence_for(code, mine), redactions=redactions)
        await self._run_custom(out)
        return out

    def _one(
        self,
        event: TrajectoryEvent,
        data: bytes | None,
        kinds: frozenset[str] | None,
        counters: Counter[str],
    ) -> tuple[TrajectoryEvent, ExtractedCode, dict[str, int]]:
        """`data` is the message's JSON (None when redaction is off) and `kinds` its PII
        pre-scan result (None: not scanned yet)."""
        if len(event.turns) > self.config.max_turns:
            raise ScoringError(
                f"trajectory has {len(event.turns)} turns, more than max_turns="
                f"{self.config.max_turns}; raise max_turns in the reward config if such "
                "trajectories are expected"
            )
        redactions: dict[str, int] = {}
        if data is not None:
            if kinds is None:
                kinds = self.redactor.candidates_json(data)
            if kinds:
                # Walk the message as sent (every string it carries, extra fields included).
                report = RedactionReport()
                cleaned = self.redactor.redact(
                    _loads(data), report, frozenset({"trajectory_id"}), kinds
                )
                if report.total:
                    event = TrajectoryEvent.model_validate_json(pydantic_core.to_json(cleaned))
                    redactions = dict(report.counts)
                    for kind, cnt in report.counts.items():
                        counters[f"redacted_{kind}"] += cnt
                    counters["trajectories_redacted"] += 1
        return event, extract_code(event, self.config.code_tools), redactions

    async def _run_custom(self, batch: PreparedBatch) -> None:
        if not self.functions or not batch.inputs:
            return
        jobs = []
        keys: list[tuple[int, str]] = []
        for i, item in batch.inputs.items():
            traj = item.trajectory
            messages = trajectory_messages(traj)
            truth = ground_truth_of(traj)
            for spec in self.config.custom_functions:
                fn = self.functions[spec.name]
                jobs.append(
                    fn.evaluate(
                        messages, truth, timeout=spec.timeout_s, trajectory=traj, **spec.kwargs
                    )
                )
                keys.append((i, spec.name))
        results: list[EvaluateResult] = await asyncio.gather(*jobs)
        per: dict[int, dict[str, EvaluateResult]] = {}
        for (i, name), res in zip(keys, results, strict=True):
            if res.error:
                batch.counters["custom_function_errors"] += 1
                if (res.model_extra or {}).get("error_kind") == "timeout":
                    batch.counters["custom_function_timeouts"] += 1
                # Error texts can quote inputs: they pass through redaction too.
                clean = self.redactor.redact_text(res.error) if self.config.redact else res.error
                res = res.model_copy(update={"error": clean})
            per.setdefault(i, {})[name] = res
        for i, res_map in per.items():
            batch.inputs[i].custom = res_map


def _loads(data: bytes) -> Any:
    """orjson's decoder (a third of json.loads's time), json.loads for what orjson refuses
    and Python's reads (a lone surrogate escape, an integer beyond 64 bits)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def opt_out_reason(event: TrajectoryEvent, config: RewardConfig) -> str | None:
    """Why this trajectory must not be kept (the user or session opted out), or None."""
    if event.metadata.rl_opt_out:
        return "metadata.rl_opt_out"
    if event.session_id in config.opt_out_sessions:
        return "session opted out"
    if config.opt_out_users:
        users = {
            str(v)
            for part in (event.model_extra, event.metadata.model_extra)
            for k, v in (part or {}).items()
            if k == "user_id" and v is not None
        }
        if users & set(config.opt_out_users):
            return "user opted out"
    return None


async def score_payloads(
    payloads: Sequence[dict[str, Any] | bytes | str],
    config: RewardConfig | None = None,
    state: WindowState | None = None,
    preparer: Preparer | None = None,
) -> tuple[list[Scored | Failure], WindowState]:
    """Score trajectory payloads without a bus (`agentrl rewards score`), in order.

    Invalid, opted-out and unpreparable trajectories come back as `Failure`s in place of
    their rewards; returns the results and the next window state.
    """
    config = config or RewardConfig()
    state = state or WindowState(config.window, config.efficiency_window)
    preparer = preparer or Preparer(config)
    events: list[TrajectoryEvent] = []
    raws: list[bytes | None] = []
    slots: list[int] = []  # payload index of each valid event
    out: dict[int, Scored | Failure] = {}
    for n, p in enumerate(payloads):
        try:
            if isinstance(p, dict):
                ev, raw = TrajectoryEvent.model_validate(p), None
            else:
                raw = p.encode() if isinstance(p, str) else p
                ev = TrajectoryEvent.model_validate_json(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "<payload>"
            out[n] = Failure("permanent", f"payload failed validation: {where}: {first['msg']}")
            continue
        why = opt_out_reason(ev, config)
        if why is not None:
            out[n] = Failure("permanent", f"dropped: {why}")
            continue
        events.append(ev)
        raws.append(raw)
        slots.append(n)
    batch = await preparer.prepare(events, raws)
    for i, failure in batch.failures.items():
        out[slots[i]] = failure
    order = batch.order
    rewards, state = score_batch([batch.inputs[i] for i in order], state, config)
    for i, r in zip(order, rewards, strict=True):
        out[slots[i]] = r
    return [out[n] for n in range(len(payloads))], state
