"""Pure conversion of validated events into columnar rows (pyarrow tables), one per table.

Each event becomes its rows only if every value fits its column's type (timestamps inside
DateTime64's range, unsigned integers inside their width, ids non-empty); an event that does
not fit is rejected with the reason, so the rest of its batch still goes in. Rows carry the
index of the delivery they came from, so a failed insert can be narrowed to its events.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import pyarrow as pa

TS = pa.timestamp("ms", tz="UTC")
STR = pa.string()
F64 = pa.float64()
U8, U32, U64 = pa.uint8(), pa.uint32(), pa.uint64()
# DateTime64(3) holds 1900-01-01 .. 2299-12-31
TS_MIN_MS = -2_208_988_800_000
TS_MAX_MS = 10_413_791_999_000
MAX_U32 = 2**32 - 1
MAX_U64 = 2**64 - 1

SCHEMAS: dict[str, pa.Schema] = {
    "trajectories": pa.schema(
        [
            ("trajectory_id", STR),
            ("session_id", STR),
            ("agent_id", STR),
            ("subordinate_profile", STR),
            ("parent_trajectory_id", STR),
            ("task_id", STR),
            ("domain", STR),
            ("model", STR),
            ("start_timestamp", TS),
            ("end_timestamp", TS),
            ("duration_ms", F64),
            ("turn_count", U32),
            ("tool_calls", U32),
            ("failed_turns", U32),
            ("total_tokens", U64),
            ("total_cost_usd", F64),
            ("temperature", F64),
            ("task_status", STR),
            ("success", U8),
            ("completion_percentage", F64),
            ("raw_json", STR),
            ("ingested_at", TS),
        ]
    ),
    "turns": pa.schema(
        [
            ("trajectory_id", STR),
            ("turn_id", U32),
            ("timestamp", TS),
            ("domain", STR),
            ("model", STR),
            ("action_type", STR),
            ("tool_name", STR),
            ("args_size", U32),
            ("success", U8),
            ("has_result", U8),
            ("error", STR),
            ("duration_ms", F64),
            ("tokens", U32),
        ]
    ),
    "rewards": pa.schema(
        [
            ("reward_id", STR),
            ("trajectory_id", STR),
            ("session_id", STR),
            ("timestamp", TS),
            ("version", U32),
            ("model", STR),
            ("total_reward", F64),
            ("raw_total_reward", F64),
            ("normalized_total_reward", F64),
            ("total_reward_kind", STR),
            ("reward_type", STR),
            ("calculator_version", STR),
            ("component_names", pa.list_(STR)),
            ("component_scores", pa.list_(F64)),
            ("component_weights", pa.list_(F64)),
            ("component_sources", pa.list_(STR)),
            ("normalization_method", STR),
            ("normalization_mean", F64),
            ("normalization_std", F64),
            ("evaluator", STR),
            ("confidence", F64),
            ("ingested_at", TS),
            ("correction", STR),
            ("turn_rewards", pa.list_(F64)),
        ]
    ),
    "feedback": pa.schema(
        [
            ("feedback_id", STR),
            ("trajectory_id", STR),
            ("session_id", STR),
            ("user_id", STR),
            ("timestamp", TS),
            ("type", STR),
            ("rating", U8),
            ("comment", STR),
            ("ingested_at", TS),
            ("correction", STR),
        ]
    ),
    "training_jobs": pa.schema(
        [
            ("training_job_id", STR),
            ("timestamp", TS),
            ("event_id", STR),
            ("status", STR),
            ("current_epoch", U32),
            ("current_step", U64),
            ("total_steps", U64),
            ("percent_complete", F64),
            ("loss", F64),
            ("reward_mean", F64),
            ("final_checkpoint", STR),
            ("base_model", STR),
            ("error_code", STR),
            ("error_message", STR),
            ("raw_json", STR),
            ("ingested_at", TS),
        ]
    ),
    "deployments": pa.schema(
        [
            ("deployment_id", STR),
            ("training_job_id", STR),
            ("timestamp", TS),
            ("model_id", STR),
            ("base_model", STR),
            ("checkpoint_path", STR),
            ("rollout_strategy", STR),
            ("traffic_percentage", F64),
            ("benchmark_passed", U8),
            ("safety_checks_passed", U8),
            ("performance_regression", U8),
            ("approval_status", STR),
            ("previous_model", STR),
            ("raw_json", STR),
            ("ingested_at", TS),
        ]
    ),
    "model_versions": pa.schema(
        [
            ("model_id", STR),
            ("base_model", STR),
            ("training_job_id", STR),
            ("checkpoint_path", STR),
            ("training_date", TS),
            ("training_samples", U64),
            ("final_reward", F64),
            ("last_deployment_id", STR),
            ("traffic_percentage", F64),
            ("previous_model", STR),
            ("updated_at", TS),
        ]
    ),
}


class RowRejected(ValueError):
    """An event whose values do not fit the warehouse's column types."""


class NotStored(Exception):
    """An event the warehouse deliberately does not keep (acked, not stored)."""


@dataclass
class TableRows:
    """Rows of one table (tuples in schema order) plus, per row, the index of the delivery
    it came from. Columns are formed once, when the arrow table is built."""

    name: str
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)

    def add(self, owner: int, values: tuple[Any, ...]) -> None:
        self.rows.append(values)
        self.owners.append(owner)

    def to_arrow(self, keep: Callable[[int], bool] | None = None) -> pa.Table:
        schema = SCHEMAS[self.name]
        rows = self.rows
        if keep is not None:
            rows = [r for r, o in zip(rows, self.owners, strict=True) if keep(o)]
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
        return pa.table(
            [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)],
            schema=schema,
        )


@dataclass
class Built:
    """The rows a batch of deliveries became, and the deliveries rejected before insert."""

    tables: list[TableRows]
    rejected: dict[int, str]
    skipped: dict[int, str] = field(default_factory=dict)


def ms(ts: datetime) -> int:
    value = int(ts.timestamp() * 1000)
    if not TS_MIN_MS <= value <= TS_MAX_MS:
        raise RowRejected(f"timestamp {ts.isoformat()} is outside 1900..2299 (DateTime64)")
    return value


def u32(value: int, name: str) -> int:
    if not 0 <= value <= MAX_U32:
        raise RowRejected(f"{name}={value} does not fit UInt32")
    return value


def u64(value: int, name: str) -> int:
    if not 0 <= value <= MAX_U64:
        raise RowRejected(f"{name}={value} does not fit UInt64")
    return value


def f64(value: float | None) -> float:
    return 0.0 if value is None else float(value)


def _text(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise RowRejected(f"payload is not UTF-8: {exc}") from exc


# ---- per-subject converters: (event, raw bytes, msg id, now ms) -> adds rows ------------


def trajectory_rows(
    ev: Any, raw: bytes, _msg_id: str, now: int, out: dict[str, TableRows], i: int
) -> None:
    meta = ev.metadata
    if meta is not None and getattr(meta, "rl_opt_out", False):
        raise NotStored("opted_out")  # the user opted out of collection (seed: PII section)
    task = ev.task_context
    outcome = ev.outcome
    model = (meta.model if meta is not None else None) or ""
    domain = str(task.domain)
    start, end = ms(ev.start_timestamp), ms(ev.end_timestamp)
    tool_calls = failed = 0
    turn_values = []
    for turn in ev.turns:
        action, result = turn.action, turn.result
        if action.type == "tool_call":
            tool_calls += 1
        ok = 1 if result is None or result.success else 0
        failed += 1 - ok
        args = action.tool_args
        turn_values.append(
            (
                ev.trajectory_id,
                u32(turn.turn_id, "turn_id"),
                ms(turn.timestamp),
                domain,
                model,
                str(action.type),
                action.tool_name or "",
                len(orjson.dumps(args)) if args else 0,
                ok,
                0 if result is None else 1,
                (result.error or "") if result is not None else "",
                f64(result.execution_time_ms) if result is not None else 0.0,
                u32(_turn_tokens(action), "tokens"),
            )
        )
    if outcome is not None:
        status = str(outcome.task_status)
        success = 1 if status == "completed_successfully" else 0
        completion = float(outcome.completion_percentage)
    else:  # no outcome block: judged by the last turn's result
        status = ""
        last = ev.turns[-1].result
        success = 1 if last is not None and last.success else 0
        completion = float(success)
    total_tokens = meta.total_tokens if meta is not None and meta.total_tokens is not None else 0
    row = (
        ev.trajectory_id,
        ev.session_id,
        ev.agent_id,
        ev.subordinate_profile or "",
        str(_extra(meta, "parent_trajectory_id") or ""),
        task.task_id,
        domain,
        model,
        start,
        end,
        float(end - start),
        u32(len(ev.turns), "turn_count"),
        tool_calls,
        failed,
        u64(total_tokens, "total_tokens"),
        f64(meta.total_cost_usd if meta is not None else None),
        f64(meta.temperature if meta is not None else None),
        status,
        success,
        completion,
        _text(raw),
        now,
    )
    out["trajectories"].add(i, row)
    turns = out["turns"]
    for values in turn_values:
        turns.add(i, values)


def reward_rows(
    ev: Any, _raw: bytes, _msg_id: str, now: int, out: dict[str, TableRows], i: int
) -> None:
    norm = getattr(ev, "normalization", None)
    meta = getattr(ev, "metadata", None)
    names, scores, weights, sources = [], [], [], []
    for name, comp in ev.reward_components.items():
        names.append(name)
        scores.append(float(comp.score))
        weights.append(float(comp.weight))
        sources.append(str(comp.source))
    raw_total = getattr(ev, "raw_total_reward", None)
    norm_total = getattr(ev, "normalized_total_reward", None)
    out["rewards"].add(
        i,
        (
            ev.reward_id,
            ev.trajectory_id,
            ev.session_id,
            ms(ev.timestamp),
            u32(int(getattr(ev, "version", 1) or 1), "version"),
            str(_extra(meta, "model") or ""),
            float(ev.total_reward),
            float(ev.total_reward if raw_total is None else raw_total),
            f64(norm_total),
            str(getattr(ev, "total_reward_kind", "raw") or "raw"),
            str(ev.reward_type),
            str(getattr(ev, "calculator_version", None) or ""),
            names,
            scores,
            weights,
            sources,
            str(getattr(norm, "method", "") or ""),
            f64(getattr(norm, "mean", None)),
            f64(getattr(norm, "std", None)),
            str(getattr(meta, "evaluator", "") or ""),
            f64(getattr(meta, "confidence", None)),
            now,
            _correction(_extra(meta, "feedback")),
            _turn_rewards(_extra(meta, "turn_rewards")),
        ),
    )


def _turn_rewards(values: Any) -> list[float]:
    """A reward's per-turn rewards (`metadata.turn_rewards`), [] when none or not numbers."""
    if not isinstance(values, list):
        return []
    try:
        return [float(v) for v in values]
    except (TypeError, ValueError):
        return []


def _correction(feedback: Any) -> str:
    """The user's correction in a reward's `metadata.feedback` ('' when none)."""
    text = feedback.get("correction") if isinstance(feedback, dict) else None
    return text if isinstance(text, str) else ""


def feedback_rows(
    ev: Any, _raw: bytes, _msg_id: str, now: int, out: dict[str, TableRows], i: int
) -> None:
    out["feedback"].add(
        i,
        (
            ev.feedback_id,
            ev.trajectory_id,
            ev.session_id or "",
            ev.user_id or "",
            ms(ev.timestamp),
            str(ev.type),
            int(ev.rating or 0),
            ev.comment or "",
            now,
            ev.correction or "",
        ),
    )


def status_rows(
    ev: Any, raw: bytes, msg_id: str, now: int, out: dict[str, TableRows], i: int
) -> None:
    progress, current = ev.progress, ev.metrics.current
    artifacts, error = ev.artifacts, ev.error
    out["training_jobs"].add(
        i,
        (
            ev.training_job_id,
            ms(ev.timestamp),
            msg_id or hashlib.sha256(raw).hexdigest(),
            str(ev.status),
            u32(progress.current_epoch, "current_epoch"),
            u64(progress.current_step, "current_step"),
            u64(progress.total_steps or 0, "total_steps"),  # absent on the wire when unknown
            float(progress.percent_complete),
            f64(current.loss),
            f64(current.reward_mean),
            (artifacts.final_checkpoint or "") if artifacts is not None else "",
            str(_extra(artifacts, "base_model") or ""),
            str(error.code) if error is not None else "",
            (error.message or "") if error is not None else "",
            _text(raw),
            now,
        ),
    )


def deployment_rows(
    ev: Any, raw: bytes, _msg_id: str, now: int, out: dict[str, TableRows], i: int
) -> None:
    info, cfg, val, meta = ev.model_info, ev.deployment_config, ev.validation_results, ev.metadata
    at = ms(ev.timestamp)
    previous = str(getattr(meta, "previous_model", None) or "")
    deployment = (
        ev.deployment_id,
        ev.training_job_id,
        at,
        info.model_id,
        info.base_model,
        info.checkpoint_path,
        str(cfg.rollout_strategy),
        float(cfg.traffic_percentage),
        int(bool(val.benchmark_passed)),
        int(bool(val.safety_checks_passed)),
        int(bool(val.performance_regression)),
        str(getattr(meta, "approval_status", "") or ""),
        previous,
        _text(raw),
        now,
    )
    version = (
        info.model_id,
        info.base_model,
        ev.training_job_id,
        info.checkpoint_path,
        ms(info.training_date) if info.training_date is not None else at,
        u64(info.training_samples or 0, "training_samples"),
        f64(info.final_reward),
        ev.deployment_id,
        float(cfg.traffic_percentage),
        previous,
        at,
    )
    out["deployments"].add(i, deployment)
    out["model_versions"].add(i, version)


def _extra(block: Any, name: str) -> Any:
    """A field of an open nested object, declared or extra (None when absent). Extras are
    looked up in the model's extra dict: a missing attribute costs pydantic an exception."""
    if block is None:
        return None
    if name in type(block).model_fields:
        return getattr(block, name)
    extra = block.__pydantic_extra__
    return extra.get(name) if extra else None


def _turn_tokens(action: Any) -> int:
    """Tokens of a turn when the producer recorded them (action.tokens or action.usage)."""
    extra = action.__pydantic_extra__
    if not extra:
        return 0
    tokens = extra.get("tokens")
    if isinstance(tokens, int):
        return tokens
    usage = extra.get("usage")
    if isinstance(usage, dict):
        total = usage.get("total_tokens")
        if isinstance(total, int):
            return total
    return 0


Converter = Callable[[Any, bytes, str, int, dict[str, TableRows], int], None]

# subject kind -> (tables it writes, converter)
KINDS: dict[str, tuple[tuple[str, ...], Converter]] = {
    "trajectory": (("trajectories", "turns"), trajectory_rows),
    "reward": (("rewards",), reward_rows),
    "feedback": (("feedback",), feedback_rows),
    "training_status": (("training_jobs",), status_rows),
    "deployment": (("deployments", "model_versions"), deployment_rows),
}


def build(kind: str, items: Sequence[tuple[Any, bytes, str]], now_ms: int) -> Built:
    """Rows of every table `kind` writes for `items` = (event, raw bytes, msg id) triples.

    Converters compute every value of an event before adding any row, so a rejected event
    leaves nothing behind in any table."""
    names, convert = KINDS[kind]
    rejected: dict[int, str] = {}
    skipped: dict[int, str] = {}
    out = {n: TableRows(n) for n in names}
    for i, (event, raw, msg_id) in enumerate(items):
        try:
            convert(event, raw, msg_id, now_ms, out, i)
        except NotStored as exc:
            skipped[i] = str(exc)
        except (RowRejected, AttributeError, TypeError, ValueError, OverflowError) as exc:
            rejected[i] = f"row rejected by the warehouse schema: {exc}"
    return Built([out[n] for n in names], rejected, skipped)
