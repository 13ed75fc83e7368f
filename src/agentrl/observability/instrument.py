"""One-line instrumentation hooks for the services (each service calls one function here).

Each hook records a whole batch at once (one `inc` per distinct label set, one increment per
touched histogram bucket), so the per-message cost stays far below the services' own work,
and never raises: an error is logged and counted by `metrics.safe`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from agentrl.observability import metrics as m


def observe_many(hist: Any, values: Iterable[float]) -> None:
    """`hist.observe(v)` for every v, batched: one increment per touched bucket."""
    isfinite = math.isfinite
    vals = [float(v) for v in values if v is not None and isfinite(v)]
    if not vals:
        return
    try:
        bounds = hist._upper_bounds
        counts = [0] * len(bounds)
        for v in vals:
            counts[bisect_left(bounds, v)] += 1
        hist._sum.inc(math.fsum(vals))
        for i, c in enumerate(counts):
            if c:
                hist._buckets[i].inc(c)
    except AttributeError:  # prometheus_client internals changed: the slow, public way
        for v in vals:
            hist.observe(v)


_children: dict[tuple[int, Any], Any] = {}


def _child(metric: Any, cap: Any, raw: Any) -> Any:
    """The labelled child of `metric` for the raw value `raw` (capped by `cap`), cached:
    a dict lookup instead of a cap check and a `labels()` call per batch. A version's
    series also carry its lineage (`metrics.version_labels`)."""
    key = (id(metric), raw)
    child = _children.get(key)
    if child is None:
        child = (
            metric.labels(**m.version_labels(raw))
            if cap is m.MODEL_VERSION
            else (metric.labels(cap(raw)))
        )
        if len(_children) < 10_000:
            _children[key] = child
    return child


def _clear_children() -> None:
    """Forget the cached children (after `metrics.switch_to_multiprocess`)."""
    _children.clear()


def reward_batch(events: list[Any], rewards: list[Any], seconds: float) -> None:
    """The reward service scored `rewards` for the trajectories `events` in `seconds`.
    Raw values are grouped first; label children are cached per raw value, so a batch costs
    a few microseconds plus about two per trajectory (`agentrl bench metrics`)."""
    if m._DISABLED[0]:
        return
    try:
        by_id = {e.trajectory_id: e for e in events}
        kinds: Counter[tuple[Any, Any]] = Counter()
        turns: list[float] = []
        per_model: dict[Any, list[float]] = {}
        success: Counter[Any] = Counter()
        components: dict[str, list[float]] = {}
        for r in rewards:
            payload = r.payload if hasattr(r, "payload") else r
            ev = by_id.get(payload.get("trajectory_id"))
            meta = ev.metadata if ev is not None else None
            model = meta.model if meta is not None else None
            values = per_model.get(model)
            if values is None:
                values = per_model[model] = []
            values.append(float(payload.get("total_reward", 0.0)))
            comps = payload.get("reward_components")
            if comps:
                for name, comp in comps.items():
                    score = (
                        comp.get("score") if type(comp) is dict else getattr(comp, "score", None)
                    )
                    if score is not None:
                        bucket = components.get(name)
                        if bucket is None:
                            bucket = components[name] = []
                        bucket.append(score)
            if ev is None:
                continue
            kinds[(ev.subordinate_profile, ev.task_context.domain)] += 1
            turns.append(len(ev.turns))
            outcome = meta.outcome if meta is not None else None
            if outcome is not None and outcome.task_status == "completed_successfully":
                success[model] += 1
        for kind, n in kinds.items():
            child = _children.get((id(m.TRAJECTORIES), kind))
            if child is None:
                agent, domain = kind
                child = m.TRAJECTORIES.labels(
                    agent_type=m.AGENT_TYPE(agent or "agent"), task_domain=m.TASK_DOMAIN(domain)
                )
                if len(_children) < 10_000:
                    _children[(id(m.TRAJECTORIES), kind)] = child
            child.inc(n)
        observe_many(m.TRAJECTORY_LENGTH, turns)
        for model, values in per_model.items():
            observe_many(_child(m.TRAJECTORY_REWARD, m.MODEL_VERSION, model), values)
        for model, n in success.items():
            _child(m.TRAJECTORY_SUCCESS, m.MODEL_VERSION, model).inc(n)
        for name, scores in components.items():
            observe_many(_child(m.REWARD_COMPONENT, m.COMPONENT, name), scores)
        if rewards:
            m.REWARDS_PUBLISHED.inc(len(rewards))
        m.REWARD_LATENCY.observe(seconds)
    except Exception:  # a metric must never break the service that records it
        with m.safe():
            raise


def bus_published(subject: str, n: int = 1) -> None:
    if n and m.enabled():
        with m.safe():
            m.BUS_PUBLISHED.labels(subject=m.SUBJECT(subject)).inc(n)


def bus_consumed(consumer: str, n: int = 1) -> None:
    if n and m.enabled():
        with m.safe():
            m.BUS_CONSUMED.labels(consumer=m.CONSUMER(consumer)).inc(n)


def bus_dead_letter(subject: str) -> None:
    m.record_dead_letter(subject)


def warehouse_insert(table: str, rows: int, seconds: float) -> None:
    if not m.enabled():
        return
    with m.safe():
        t = m.TABLE(table)
        m.WAREHOUSE_BATCH_ROWS.labels(table=t).observe(rows)
        m.WAREHOUSE_INSERT_LATENCY.labels(table=t).observe(seconds)
        m.WAREHOUSE_ROWS.labels(table=t).inc(rows)


def gateway_request(version: str, seconds: float, error: bool) -> None:
    m.record_gateway_request(version, seconds, error)


def training_status(
    status: str,
    duration_s: float | None = None,
    samples: int | None = None,
    lineage: str | None = None,
) -> None:
    """A job of `lineage` (None: the default one) reached `status`; a finished job also
    reports its duration and sample count."""
    m.record_training_status(status, lineage)
    if duration_s is not None and status in ("completed", "failed", "cancelled"):
        m.observe(m.TRAINING_DURATION, duration_s)
    if samples:
        m.observe(m.TRAINING_SAMPLES, samples)


def training_queue(queued: int, running: int) -> None:
    m.set_gauge(m.TRAINING_QUEUE_DEPTH, queued)
    m.set_gauge(m.TRAINING_JOBS_RUNNING, running)


def training_step(
    steps: int = 1, reward_mean: float | None = None, loss: float | None = None
) -> None:
    """From a job process (multiprocess mode): its optimiser steps and latest curve point."""
    m.inc(m.TRAINING_STEPS, steps)
    if reward_mean is not None and math.isfinite(reward_mean):
        m.set_gauge(m.TRAINING_REWARD, reward_mean)
    if loss is not None and math.isfinite(loss):
        m.set_gauge(m.TRAINING_LOSS, loss)


def deployment(
    status: str | None = None,
    traffic: Mapping[str, float] | None = None,
    rewards: Mapping[str, float] | None = None,
    scores: Mapping[tuple[str, str], float] | None = None,
) -> None:
    """A deployment changed state and/or the split and per-version rewards were measured.
    `traffic` is the split, {version: ratio 0-1}: its versions get their own labels (those
    that left it drop to 0, then are evicted at the next change); the versions of `scores`
    are announced (the registry knows them)."""
    if status:
        m.record_deployment(status)
    if not m.enabled():
        return
    with m.safe():
        if traffic is not None:
            m.versions_changed(*m.MODEL_VERSION.set_split(traffic))
            for v in m.MODEL_VERSION.previous - m.MODEL_VERSION.current:
                m.MODEL_TRAFFIC_RATIO.labels(lineage=m.lineage_of(v), model_version=v).set(0.0)
            for v, r in traffic.items():
                m.MODEL_TRAFFIC_RATIO.labels(**m.version_labels(v)).set(float(r))
        for v, _ in scores or {}:
            m.versions_changed(*m.MODEL_VERSION.announce(v))
        for v, value in (rewards or {}).items():
            if value is not None and math.isfinite(value):
                m.MODEL_REWARD_MEAN.labels(**m.version_labels(v)).set(value)
        for (v, task), value in (scores or {}).items():
            m.MODEL_BENCHMARK_SCORE.labels(**m.version_labels(v), task_type=m.TASK_TYPE(task)).set(
                value
            )


def split_seen(weights: Mapping[str, float]) -> None:
    """A process read the split (percentages): label its versions, as a write would."""
    if m.enabled() and frozenset(weights) != m.MODEL_VERSION.current:
        deployment(traffic={v: w / 100.0 for v, w in weights.items()})


def bus_published_many(items: list[tuple[str, bytes, str]]) -> None:
    """A pipelined batch of (subject, data, msg_id) was stored: one inc per subject."""
    if not items or not m.enabled():
        return
    with m.safe():
        first = items[0][0]
        if all(item[0] == first for item in items):  # the common case: one subject
            m.BUS_PUBLISHED.labels(subject=m.SUBJECT(first)).inc(len(items))
            return
        for subject, n in Counter(item[0] for item in items).items():
            m.BUS_PUBLISHED.labels(subject=m.SUBJECT(subject)).inc(n)


def gateway_started(version: str) -> None:
    """A chat completion request was routed to `version` (counts every request, streamed too).
    Per request: the label child is cached (a dict lookup, no `labels()` call)."""
    if m._DISABLED[0]:
        return
    try:
        _child(m.GATEWAY_REQUESTS, m.MODEL_VERSION, version).inc()
    except Exception:
        with m.safe():
            raise


def gateway_done(version: str, seconds: float) -> None:
    """A non-streamed request to `version` answered after `seconds`."""
    if m._DISABLED[0]:
        return
    try:
        _child(m.GATEWAY_LATENCY, m.MODEL_VERSION, version).observe(seconds)
    except Exception:
        with m.safe():
            raise


def gateway_error(version: str) -> None:
    """A request to `version` failed on the server side (5xx: backend error or timeout)."""
    if m.enabled():
        with m.safe():
            m.GATEWAY_ERRORS.labels(**m.version_labels(version)).inc()


_DEPLOY_STATUS = {
    "bootstrap": "deployed",
    "set_weight": "canary",
    "step": "canary",
    "manual_weight": "canary",
    "promote": "promoted",
    "rollback": "rolled_back",
}


def deployment_action(action: str | None, model_id: str, weight: float | None = None) -> None:
    """The deployer published a deployment event for `action` (start/step/promote/rollback)
    of `model_id` (counted under the version's lineage)."""
    status = _DEPLOY_STATUS.get(action or "", action or "unknown")
    m.record_deployment(status, m.lineage_of(model_id))
