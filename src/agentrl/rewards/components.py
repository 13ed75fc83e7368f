"""The seed's four reward components as pure functions (seed 000, "Reward Computation Strategy").

Each returns a `ComponentScore` in [0, 1], or None when the component does not apply. Running
statistics (efficiency) and tool results (code quality) are passed in; nothing here does I/O.
`informative` is False when a score is a neutral fallback rather than evidence (no feedback
given, too little history), which lowers the reward's confidence.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from agentrl.contracts.trajectory import Outcome, TrajectoryEvent

TASK_COMPLETION = "task_completion"
EFFICIENCY = "efficiency"
CODE_QUALITY = "code_quality"
USER_FEEDBACK = "user_feedback"
BUILTIN = (TASK_COMPLETION, EFFICIENCY, CODE_QUALITY, USER_FEEDBACK)


@dataclass
class ComponentScore:
    score: float
    source: str = "automated"
    reasoning: str = ""
    informative: bool = True
    metrics: dict[str, Any] = field(default_factory=dict)


# ---- 1. task completion ------------------------------------------------------------------
def task_completion(outcome: Outcome | None) -> ComponentScore | None:
    """1.0 when completed, 0.5 + 0.5 x completion_percentage when partial, else 0.0.

    None when the trajectory carries no outcome block: an unknown outcome is not a failure.
    """
    if outcome is None:
        return None
    if outcome.task_status == "completed_successfully":
        return ComponentScore(1.0, reasoning="task completed successfully")
    if outcome.task_status == "partial_completion":
        pct = float(outcome.completion_percentage)
        return ComponentScore(
            0.5 + 0.5 * pct,
            reasoning=f"partial completion ({pct:.0%}): 0.5 + 0.5 x {pct:.2f}",
        )
    return ComponentScore(0.0, reasoning=f"task {outcome.task_status}")


# ---- 2. efficiency -----------------------------------------------------------------------
def efficiency_score(turns: float, mean_turns: float, std_turns: float) -> float:
    """The seed's formula: z = (mean - turns) / std, capped to [-2, 2], mapped to [0, 1].

    A zero std (every past trajectory took the same number of turns) uses 1e-8, so fewer
    turns than all of them scores 1.0, as many 0.5, more 0.0.
    """
    z = (mean_turns - turns) / (std_turns if std_turns > 0 else 1e-8)
    z = max(-2.0, min(2.0, z))
    return (z + 2.0) / 4.0


def efficiency(
    trajectory: TrajectoryEvent,
    history_count: float,
    mean_turns: float,
    std_turns: float,
    min_history: int,
    *,
    by_completion: bool = True,
) -> ComponentScore:
    """Efficiency against the running turn statistics of the trajectory's domain, times the
    completion fraction (`by_completion`, the seed correction; see `completion_fraction`).

    With fewer than `min_history` past trajectories of the domain there is no fair comparison
    yet: the score is a neutral 0.5, marked not informative.
    """
    turns = len(trajectory.turns)
    domain = trajectory.task_context.domain
    metrics = efficiency_signals(trajectory)
    metrics.update(
        domain_mean_turns=mean_turns, domain_std_turns=std_turns, domain_history=int(history_count)
    )
    if history_count < min_history:
        return ComponentScore(
            0.5,
            reasoning=(
                f"completed in {turns} turns; only {int(history_count)} earlier {domain} "
                f"trajectories (< {min_history}), neutral score"
            ),
            informative=False,
            metrics=metrics,
        )
    raw = efficiency_score(turns, mean_turns, std_turns)
    done = completion_fraction(trajectory.outcome) if by_completion else 1.0
    score = raw * done
    metrics.update(efficiency_raw=raw, completion_fraction=done)
    return ComponentScore(
        score,
        reasoning=(
            f"completed in {turns} turns, avg is {mean_turns:.1f} ± {std_turns:.1f} turns for "
            f"{domain} tasks; x {done:.2f} completion"
        ),
        metrics=metrics,
    )


def completion_fraction(outcome: Outcome | None) -> float:
    """Seed correction: efficiency counts only in proportion to completion (1 when completed,
    the completion percentage when partial, 0 when failed; 1 without an outcome block), so a
    short failure never earns the efficiency a short success does."""
    if outcome is None or outcome.task_status == "completed_successfully":
        return 1.0
    if outcome.task_status == "partial_completion":
        return max(0.0, min(1.0, float(outcome.completion_percentage)))
    return 0.0


def efficiency_signals(trajectory: TrajectoryEvent) -> dict[str, Any]:
    """The seed's secondary efficiency signals, reported as metrics (not scored).

    redundant_tool_calls counts calls repeating an earlier call's tool_name and tool_args.
    """
    seen: set[tuple[str, Any]] = set()
    tool_calls = 0
    exec_ms: list[float] = []
    for turn in trajectory.turns:  # one pass (this runs for every trajectory scored)
        action = turn.action
        if action.tool_name and action.type in _TOOL_ACTIONS:
            tool_calls += 1
            try:  # flat arguments (the common case): hashable as they are
                seen.add((action.tool_name, frozenset(action.tool_args.items())))
            except TypeError:
                seen.add((action.tool_name, _freeze(action.tool_args)))
        result = turn.result
        if result is not None and result.execution_time_ms is not None:
            exec_ms.append(result.execution_time_ms)
    redundant = tool_calls - len(seen)  # calls beyond the first of each (tool, args)
    return {
        "turns": len(trajectory.turns),
        "wall_time_s": (trajectory.end_timestamp - trajectory.start_timestamp).total_seconds(),
        "tool_execution_ms": float(sum(exec_ms)) if exec_ms else None,
        "total_tokens": trajectory.metadata.total_tokens,
        "total_cost_usd": trajectory.metadata.total_cost_usd,
        "tool_calls": tool_calls,
        "redundant_tool_calls": redundant,
    }


_TOOL_ACTIONS = frozenset(("tool_call", "subordinate_call"))


def _freeze(value: Any) -> Any:
    """A hashable, key-order-independent form of JSON-like tool arguments."""
    if type(value) is dict:
        try:  # the common case: flat arguments of strings and numbers
            flat = tuple(sorted(value.items()))
            hash(flat)
            return flat
        except TypeError:
            pass
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


# ---- 3. code quality ---------------------------------------------------------------------
@dataclass
class CodeEvidence:
    """What the code-quality component may use; each part None when not available."""

    contains_code: bool
    lint_score: float | None = None  # out of 10
    lint_findings: int = 0
    lint_lines: int = 0
    tests_passed: int | None = None
    tests_total: int | None = None
    critical_issues: int | None = None  # bandit HIGH severity findings
    other_security_issues: int = 0
    unavailable: str | None = None  # why (some of) the code could not be analysed


def code_quality(evidence: CodeEvidence) -> ComponentScore | None:
    """Average of lint score / 10, test pass rate and 1 - 0.5 x critical issues (floored at 0).

    None when the trajectory contains no code; 0.5 (not informative) when it has code but none
    of the three could be measured, as in the seed.
    """
    if not evidence.contains_code:
        return None
    scores: list[float] = []
    parts: list[str] = []
    metrics: dict[str, Any] = {}
    if evidence.lint_score is not None:
        scores.append(evidence.lint_score / 10.0)
        parts.append(
            f"ruff score {evidence.lint_score:.1f}/10 ({evidence.lint_findings} findings in {evidence.lint_lines} lines)"
        )
        metrics.update(
            lint_score=evidence.lint_score,
            lint_findings=evidence.lint_findings,
            lint_lines=evidence.lint_lines,
        )
    if evidence.tests_total:
        passed = evidence.tests_passed or 0
        scores.append(passed / evidence.tests_total)
        parts.append(f"tests {passed}/{evidence.tests_total} passed")
        metrics.update(tests_passed=passed, tests_total=evidence.tests_total)
    if evidence.critical_issues is not None:
        scores.append(max(0.0, 1.0 - 0.5 * evidence.critical_issues))
        parts.append(
            "no critical issues"
            if evidence.critical_issues == 0
            else f"{evidence.critical_issues} critical security issue(s)"
        )
        metrics.update(
            critical_issues=evidence.critical_issues,
            other_security_issues=evidence.other_security_issues,
        )
    if evidence.unavailable:
        metrics["unavailable"] = evidence.unavailable
        parts.append(f"analysis unavailable ({evidence.unavailable})")
    if not scores:
        return ComponentScore(
            0.5,
            source="linter",
            reasoning=", ".join(parts)
            if evidence.unavailable
            else "code found but nothing measurable (not Python, no tests)",
            informative=False,
            metrics=metrics,
        )
    return ComponentScore(
        sum(scores) / len(scores), source="linter", reasoning=", ".join(parts), metrics=metrics
    )


# ---- 4. user feedback --------------------------------------------------------------------
@dataclass
class FeedbackState:
    """The user's signals about one trajectory: explicit feedback (latest wins) and implicit
    flags, from the outcome block and from later feedback events."""

    explicit: str | None = None  # thumbs_up | thumbs_down | rating
    rating: int | None = None
    correction_requested: bool = False
    task_abandoned: bool = False
    feedback_ids: list[str] = field(default_factory=list)
    correction: str | None = None  # the user's words on what it should have done (latest)

    @classmethod
    def from_outcome(cls, outcome: Outcome | None) -> FeedbackState:
        if outcome is None:
            return cls()
        fb = outcome.user_feedback
        return cls(
            explicit=fb.type if fb else None,
            rating=fb.rating if fb else None,
            correction_requested=outcome.correction_requested,
            task_abandoned=outcome.task_abandoned,
        )

    @classmethod
    def from_trajectory(cls, trajectory: TrajectoryEvent) -> FeedbackState:
        """`from_outcome`, plus a correction the trajectory itself carries: the user's words
        given when the episode ended (`metadata.capture.correction`, or `metadata.correction`)."""
        state = cls.from_outcome(trajectory.outcome)
        extra = trajectory.metadata.model_extra or {}
        capture = extra.get("capture")
        for text in (capture.get("correction") if isinstance(capture, dict) else None,
                     extra.get("correction")):  # fmt: skip
            if isinstance(text, str) and text.strip():
                state.correction = text.strip()
                break
        return state

    def apply(
        self,
        kind: str,
        rating: int | None = None,
        feedback_id: str | None = None,
        correction: str | None = None,
    ) -> None:
        """Fold one feedback event in (thumbs_up|thumbs_down|rating|correction|abandoned|comment).

        `correction`: free text beside any kind (a thumbs-down with "read the CSV first");
        the latest one is kept, and jobs read it as the hint of the trajectory's task."""
        if kind in ("thumbs_up", "thumbs_down", "rating"):
            self.explicit, self.rating = kind, rating
        elif kind == "correction":
            self.correction_requested = True
        elif kind == "abandoned":
            self.task_abandoned = True
        elif kind == "comment":
            pass  # kept with its feedback id; the next reward version cites it
        else:
            raise ValueError(f"unknown feedback type {kind!r}")
        if correction is not None and correction.strip():
            self.correction = correction.strip()
        if feedback_id:
            self.feedback_ids.append(feedback_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "explicit": self.explicit,
            "rating": self.rating,
            "correction_requested": self.correction_requested,
            "task_abandoned": self.task_abandoned,
            "feedback_ids": list(self.feedback_ids),
            "correction": self.correction,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeedbackState:
        return cls(**{k: v for k, v in data.items() if k in _STATE_FIELDS})


_STATE_FIELDS = frozenset(FeedbackState.__dataclass_fields__)


def correction_of(payload: dict[str, Any]) -> str | None:
    """The correction text of a feedback payload: its `correction`, or for a `correction`
    feedback without one, its comment (the control API accepts either)."""
    text = payload.get("correction")
    if (not isinstance(text, str) or not text.strip()) and payload.get("type") == "correction":
        text = payload.get("comment")
    return text.strip() if isinstance(text, str) and text.strip() else None


def user_feedback(state: FeedbackState) -> ComponentScore:
    """thumbs_up 1.0, thumbs_down 0.0, rating r/5; else correction 0.2, abandoned 0.0, else 0.5."""
    if state.explicit == "thumbs_up":
        return ComponentScore(1.0, source="human", reasoning="user marked as helpful")
    if state.explicit == "thumbs_down":
        return ComponentScore(0.0, source="human", reasoning="user marked as unhelpful")
    if state.explicit == "rating" and state.rating is not None:
        return ComponentScore(
            state.rating / 5.0, source="human", reasoning=f"user rated {state.rating}/5"
        )
    if state.correction_requested:
        return ComponentScore(0.2, source="implicit", reasoning="user requested a correction")
    if state.task_abandoned:
        return ComponentScore(0.0, source="implicit", reasoning="user abandoned the task")
    return ComponentScore(
        0.5, source="default", reasoning="no user feedback (neutral)", informative=False
    )


# ---- 5. partial credit per turn (tool use) -------------------------------------------------
# What a tool-calling agent did right on the way, scored per turn (ToolRL: a reward per
# component of a call; MT-GRPO: credit per turn). The calculator weighs them into a bonus of
# at most `partial_credit.cap` (< the success reward) that only a failed trajectory adds to
# its total, and spreads it over the turns that earned it (`metadata.turn_rewards`).
TOOL_CALL_VALID = "tool_call_valid"  # an offered tool called with arguments that validate
TOOL_CALL_RAN = "tool_call_ran"  # the call ran without error
NEEDED_VALUE = "needed_value"  # a tool result holds a value the task needs
ANSWER_GIVEN = "answer_given"  # a final answer was given
ANSWER_RIGHT = "answer_right"  # the final answer is right
PARTIAL = (TOOL_CALL_VALID, TOOL_CALL_RAN, NEEDED_VALUE, ANSWER_GIVEN, ANSWER_RIGHT)

_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
# What an environment writes around a tool's output, not the output itself (agentrl's
# tool-use environment: the step budget, the sandbox's exit code): a count of 3 must not be
# "found" in "(Steps left: 3. ...)".
ENV_NOTES = re.compile(r"\(Steps left: [^)]*\)|Out of steps[^\n\"]*|exit code -?\d+")


@dataclass
class PartialCredit:
    """The five components of one trajectory (None: does not apply) and, per component, the
    share of its score each turn earned (`shares[name][k]` over turns k; they sum to the
    score), so the calculator can place the credit on the turns."""

    components: dict[str, ComponentScore | None]
    shares: dict[str, list[float]]
    turn_ids: list[int]
    success: bool | None


def offered_tools(trajectory: TrajectoryEvent) -> dict[str, dict[str, Any] | None] | None:
    """Tool name -> its JSON Schema of arguments (None: any arguments), from the task's
    `tool_specs` (OpenAI function specs) and the turns' `available_tools`; None when the
    trajectory names none (the environment's own verdict is used then)."""
    out: dict[str, dict[str, Any] | None] = {}
    specs = (trajectory.task_context.model_extra or {}).get("tool_specs") or []
    lists = [specs] + [
        t.observation.context.available_tools for t in trajectory.turns if t.observation.context
    ]
    for items in lists:
        for item in items if isinstance(items, list) else ():
            if isinstance(item, str) and item:
                out.setdefault(item, None)
            elif isinstance(item, dict):
                inner = item.get("function")
                fn: dict[str, Any] = inner if isinstance(inner, dict) else item
                name = fn.get("name")
                if isinstance(name, str) and name:
                    params = fn.get("parameters")
                    if isinstance(params, dict) or out.get(name) is None:
                        out[name] = params if isinstance(params, dict) else None
    return out or None


def needed_values(trajectory: TrajectoryEvent) -> list[Any]:
    """What the task needs, where the environment says: `task_context.needed_values` (a list
    the environment may give: intermediate values too), else its `ground_truth`."""
    extra = trajectory.task_context.model_extra or {}
    given = extra.get("needed_values")
    if isinstance(given, list) and given:
        return [v for v in given if v is not None and not isinstance(v, bool)]
    truth = extra.get("ground_truth")
    if truth is None or isinstance(truth, bool | dict):
        return []
    return [v for v in truth if v is not None] if isinstance(truth, list) else [truth]


def mentions(text: str, value: Any) -> bool:
    """Whether `text` states `value`: a number equal within 1e-6 (relative; thousands commas
    allowed), or a text value as a whole word, case-insensitively."""
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.replace(",", "").strip())
        except ValueError:
            number = None
    if number is not None and math.isfinite(number):
        tol = 1e-6 * max(1.0, abs(number))
        for m in _NUMBER.finditer(text):
            try:
                if abs(float(m.group().replace(",", "")) - number) <= tol:
                    return True
            except ValueError:
                continue
        return False
    if isinstance(value, str) and value.strip():
        return (
            re.search(rf"(?<!\w){re.escape(value.strip())}(?!\w)", text, re.IGNORECASE) is not None
        )
    return False


def _args_valid(schema: dict[str, Any] | None, args: Any) -> bool:
    if not isinstance(args, dict):
        return False
    if schema is None:
        return True
    import jsonschema_rs

    try:
        return bool(jsonschema_rs.validator_for(schema).is_valid(args))
    except (ValueError, jsonschema_rs.ValidationError):  # a broken spec: the call can't be judged
        return True


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def partial_credit(trajectory: TrajectoryEvent) -> PartialCredit:
    """The five partial-credit components of one trajectory, with each turn's share.

    A turn is the final answer (action `response`, not marked an invalid action by the
    environment), a tool call (`tool_call`/`subordinate_call`), or an attempt that is
    neither (a reply the environment could not read: an invalid call). Valid: the tool is
    offered (task `tool_specs` / `available_tools`) and its arguments validate against its
    schema, and the environment did not mark the action invalid; with neither source the
    verdict is unknown and the turn is left out. Ran: a valid call whose result is a success
    without error (`step_info.tool_error` included). Needed value: the first tool result
    that states a needed value (1 at that turn). Answer given / right: at the last turn.
    """
    offered = offered_tools(trajectory)
    needed = needed_values(trajectory)
    turns = trajectory.turns
    n = len(turns)
    valid: list[bool | None] = [None] * n
    ran: list[bool | None] = [None] * n
    found_at: int | None = None
    answered = False
    for k, turn in enumerate(turns):
        a = turn.action
        info = (turn.model_extra or {}).get("step_info") or {}
        invalid = info.get("invalid_action") if isinstance(info, dict) else None
        if a.type == "memory_update":
            continue
        if a.type == "response" and not invalid:
            if k == n - 1:
                answered = True
            continue
        is_call = a.type in _TOOL_ACTIONS and bool(a.tool_name)
        verdict: bool | None = None if invalid is None else not invalid
        if offered is not None:
            ok = (
                is_call
                and a.tool_name in offered
                and _args_valid(offered[a.tool_name or ""], a.tool_args)
            )
            verdict = ok if verdict is None else (verdict and ok)
        elif not is_call and verdict is None:
            verdict = False  # neither a call nor an answer: nothing the agent could run
        valid[k] = verdict
        if verdict and is_call:
            r = turn.result
            if r is not None:
                tool_error = bool(info.get("tool_error")) if isinstance(info, dict) else False
                ran[k] = bool(r.success) and not r.error and not tool_error
                if found_at is None and needed and ran[k] is not None:
                    out = ENV_NOTES.sub(" ", _text(r.output))
                    if any(mentions(out, v) for v in needed):
                        found_at = k
    comps: dict[str, ComponentScore | None] = {}
    shares: dict[str, list[float]] = {}

    def fraction(name: str, flags: list[bool | None], what: str) -> None:
        judged = [k for k, f in enumerate(flags) if f is not None]
        if not judged:
            comps[name] = None
            return
        good = sum(1 for k in judged if flags[k])
        comps[name] = ComponentScore(
            good / len(judged),
            reasoning=f"{good} of {len(judged)} {what}",
            metrics={"good": good, "judged": len(judged)},
        )
        shares[name] = [(1.0 / len(judged)) if flags[k] else 0.0 for k in range(n)]

    def at(k: int | None) -> list[float]:
        return [1.0 if j == k else 0.0 for j in range(n)]

    fraction(TOOL_CALL_VALID, valid, "calls named an offered tool with valid arguments")
    fraction(TOOL_CALL_RAN, ran, "valid calls ran without error")
    if needed:
        comps[NEEDED_VALUE] = ComponentScore(
            1.0 if found_at is not None else 0.0,
            reasoning=(
                f"turn {turns[found_at].turn_id}'s tool result states a needed value"
                if found_at is not None
                else "no tool result states a value the task needs"
            ),
        )
        shares[NEEDED_VALUE] = at(found_at)
    else:
        comps[NEEDED_VALUE] = None
    comps[ANSWER_GIVEN] = ComponentScore(
        1.0 if answered else 0.0,
        reasoning="a final answer was given" if answered else "no final answer",
    )
    shares[ANSWER_GIVEN] = at(n - 1 if answered else None)
    outcome = trajectory.outcome
    success: bool | None = None
    if outcome is not None:
        success = outcome.task_status == "completed_successfully"
        comps[ANSWER_RIGHT] = ComponentScore(
            1.0 if success else 0.0,
            reasoning="the final answer is right" if success else f"task {outcome.task_status}",
        )
        shares[ANSWER_RIGHT] = at(n - 1 if success else None)
    else:
        comps[ANSWER_RIGHT] = None
    return PartialCredit(comps, shares, [t.turn_id for t in turns], success)
