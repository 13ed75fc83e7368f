"""Every Prometheus metric agentrl exports, in one place (services import these objects).

Names follow Prometheus conventions, which corrects the seed where it slipped: counters end
in `_total`; durations are seconds; a traffic share is a 0-1 ratio
(`agent_rl_model_traffic_ratio`, not `..._percentage`); an error rate is not exported as a
gauge but derived in PromQL from `agent_rl_gateway_requests_total` and
`agent_rl_gateway_errors_total`; no label takes unbounded values (no trajectory, session or
job ids): subjects, consumers and task domains go through a `LabelCap`, which keeps the first
N distinct values and maps the rest to "other"; model versions go through `VersionLabels`,
which follows the registry's split (the versions in the split always have their own label,
those that left it are evicted, names the registry never announced are "other").

Families whose label values are known up front (job and deployment statuses, trajectory
domains, the versions of the split) are initialised at zero (NaN for the per-version means and
scores: not measured yet), so `/metrics` shows them from the first scrape and `rate()` and
`absent()` work from the start (Prometheus's instrumentation guide).

Multiprocess: training jobs run in child processes. When `PROMETHEUS_MULTIPROC_DIR` (or
`AGENTRL_METRICS_MULTIPROC_DIR`) is set before this module is imported, every process writes
its samples to memory-mapped files there and `/metrics` merges them (prometheus_client's
multiprocess mode); `enable_multiprocess(dir)` sets it up from code (before the first import).

Recording must never break a service: the helpers at the bottom swallow and count any error.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

from agentrl.observability.multiproc import (  # noqa: F401  (re-exported)
    ENV_AGENTRL_MULTIPROC,
    ENV_MULTIPROC,
    enable_multiprocess,
)

log = logging.getLogger(__name__)

ENV_DISABLED = "AGENTRL_METRICS_DISABLED"


if os.environ.get(ENV_AGENTRL_MULTIPROC) and not os.environ.get(ENV_MULTIPROC):
    os.environ[ENV_MULTIPROC] = os.environ[ENV_AGENTRL_MULTIPROC]

from prometheus_client import (  # noqa: E402  (the environment above must be set first)
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import values as _values  # noqa: E402

MULTIPROCESS = bool(os.environ.get(ENV_MULTIPROC))
if MULTIPROCESS:  # the value class is chosen per metric child: make sure it is the mmap one
    _values.ValueClass = _values.get_value_class()


def enabled() -> bool:
    """Metrics on (default) or off (`AGENTRL_METRICS_DISABLED=1`, used by the overhead bench)."""
    return not _DISABLED[0]


_DISABLED = [os.environ.get(ENV_DISABLED, "") not in ("", "0", "false")]


def set_enabled(on: bool) -> None:
    """Turn recording on or off at run time (benchmarks measure the overhead this way)."""
    _DISABLED[0] = not on


# ---- bounded label values ----------------------------------------------------------------

OTHER = "other"


class LabelCap:
    """Keeps at most `max_values` distinct label values (first come, or a fixed allow-list);
    anything else becomes "other", so a flood of new versions or subjects cannot blow up
    Prometheus's series count."""

    def __init__(
        self, name: str, max_values: int = 20, allowed: tuple[str, ...] = (), max_len: int = 64
    ) -> None:
        self.name = name
        self.max_values = max_values
        self.max_len = max_len
        self._seen: set[str] = set(allowed)
        self._fixed = bool(allowed)
        self._lock = threading.Lock()

    def __call__(self, value: Any) -> str:
        text = str(value if value not in (None, "") else "unknown")[: self.max_len]
        if text in self._seen:
            return text
        if self._fixed:
            return OTHER
        with self._lock:
            if len(self._seen) < self.max_values:
                self._seen.add(text)
                return text
        return OTHER

    def reset(self) -> None:
        with self._lock:
            if not self._fixed:
                self._seen.clear()


class VersionLabels:
    """`model_version` label values that follow the registry's split (issue 28.10).

    Always labelled: the versions of the current split, and of the previous one (a version
    just rolled back keeps its last values until the next change). Names the registry
    announced (a validated candidate, a deployment event) get a label while fewer than
    `max_values` are labelled; any other name is "other". A version that is in neither split
    nor among the announced ones is evicted: `versions_changed` removes its series, so the
    slots follow the split instead of the first names the process ever saw."""

    name = "model_version"

    def __init__(self, max_values: int = 20, max_len: int = 64) -> None:
        self.max_values = max_values
        self.max_len = max_len
        self.current: frozenset[str] = frozenset()
        self.previous: frozenset[str] = frozenset()
        self.announced: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, value: Any) -> str:
        text = str(value if value not in (None, "") else "unknown")[: self.max_len]
        if text in self.current or text in self.previous or text in self.announced:
            return text
        return OTHER

    def labelled(self) -> set[str]:
        return set(self.current) | set(self.previous) | set(self.announced)

    def set_split(self, versions: Iterable[str]) -> tuple[list[str], list[str]]:
        """The split now holds `versions`: -> (newly labelled, evicted)."""
        now = frozenset(str(v)[: self.max_len] for v in versions)
        with self._lock:
            if now == self.current:
                return [], []
            before = self.labelled()
            self.previous, self.current = self.current, now
            for v in now:  # in the split: no longer needs an announced slot
                self.announced.pop(v, None)
            self._trim()
            after = self.labelled()
        return sorted(after - before), sorted(before - after)

    def announce(self, name: str) -> tuple[list[str], list[str]]:
        """The registry knows `name` (validated, deployed): -> (newly labelled, evicted)."""
        text = str(name)[: self.max_len]
        with self._lock:
            before = self.labelled()
            if text in self.current or text in self.previous:
                return [], []
            self.announced[text] = None
            self.announced.move_to_end(text)
            self._trim()
            after = self.labelled()
        return sorted(after - before), sorted(before - after)

    def _trim(self) -> None:
        while self.announced and len(self.labelled()) > self.max_values:
            self.announced.popitem(last=False)

    def reset(self) -> None:
        with self._lock:
            self.current = self.previous = frozenset()
            self.announced.clear()


MODEL_VERSION = VersionLabels(max_values=20)
# the lineage of a version (`agentrl.release.lineage`: a public model name with its own
# versions): few by design, capped all the same; its value comes from the version id
LINEAGE = LabelCap("lineage", max_values=32)
DEFAULT_LINEAGE = ["agentrl-policy"]  # DeploySettings.public_model (`set_default_lineage`)
# a version id is `<lineage>-vN` or `<lineage>-base` (`release.actions`; a lineage name never
# ends like one, `release.lineage.check_name`)
_VERSION_SUFFIX = re.compile(r"-(?:v\d+|base)$")
_lineage_of: dict[str, str] = {}


def set_default_lineage(name: str) -> None:
    """The default lineage's name (the deployment's public model): the lineage label of a
    version whose id names none (a hand-made id such as `v1`)."""
    if name and name != DEFAULT_LINEAGE[0]:
        DEFAULT_LINEAGE[0] = name
        _lineage_of.clear()
        instrument = sys.modules.get("agentrl.observability.instrument")
        if instrument is not None:  # its cached children carry the old default
            instrument._clear_children()


def lineage_of(version: Any) -> str:
    """The `lineage` label of a version id: the id without its `-vN` / `-base` suffix, else
    the default lineage (capped by `LINEAGE`; cached, a dict lookup per call)."""
    text = str(version if version not in (None, "") else "unknown")
    found = _lineage_of.get(text)
    if found is None:
        head = _VERSION_SUFFIX.sub("", text)
        found = LINEAGE(head if head != text and head else DEFAULT_LINEAGE[0])
        if len(_lineage_of) < 10_000:
            _lineage_of[text] = found
    return found


def version_labels(version: Any) -> dict[str, str]:
    """The labels of a per-version series: its lineage and its (bounded) version label."""
    return {"lineage": lineage_of(version), "model_version": MODEL_VERSION(version)}


SUBJECT = LabelCap("subject", max_values=40)
CONSUMER = LabelCap("consumer", max_values=40)
STREAM = LabelCap("stream", max_values=20)
AGENT_TYPE = LabelCap("agent_type", max_values=20)
TASK_DOMAIN = LabelCap("task_domain", max_values=30)
TASK_TYPE = LabelCap("task_type", max_values=30)
TABLE = LabelCap("table", max_values=20)
COMPONENT = LabelCap("component", max_values=20)
COLLECTOR = LabelCap("collector", max_values=20)
STATUS = LabelCap(
    "status",
    allowed=(
        "queued",
        "started",
        "running",
        "completed",
        "failed",
        "cancelled",
        "pending",
        "validating",
        "canary",
        "promoted",
        "deployed",
        "rolled_back",
        "rejected",
        "ok",
        "error",
    ),
)

# ---- the seed's metrics (conventions applied) ---------------------------------------------

# Training jobs
TRAINING_JOBS = Counter(
    "agent_rl_training_jobs_total",
    "Training jobs that reached a status (queued, started, completed, failed, cancelled), "
    "per lineage.",
    ["lineage", "status"],
)
TRAINING_DURATION = Histogram(
    "agent_rl_training_duration_seconds",
    "Wall time of a finished training job.",
    buckets=(60, 300, 600, 1800, 3600, 7200, 14400),
)
TRAINING_SAMPLES = Histogram(
    "agent_rl_training_samples",
    "Number of samples a training job used.",
    buckets=(100, 1000, 5000, 10000, 50000, 100000),
)
TRAINING_QUEUE_DEPTH = Gauge(
    "agent_rl_training_queue_depth",
    "Training jobs waiting in the queue.",
    multiprocess_mode="livemax",
)
TRAINING_JOBS_RUNNING = Gauge(
    "agent_rl_training_jobs_running",
    "Training jobs running now.",
    multiprocess_mode="livemax",
)
TRAINING_STEPS = Counter(
    "agent_rl_training_steps_total",
    "Optimiser steps taken by training jobs (reported from the job processes).",
)
TRAINING_REWARD = Gauge(
    "agent_rl_training_reward_mean",
    "Mean reward of the latest training step of the running job (its training curve).",
    multiprocess_mode="mostrecent",
)
TRAINING_LOSS = Gauge(
    "agent_rl_training_loss",
    "Loss of the latest training step of the running job.",
    multiprocess_mode="mostrecent",
)

# Model performance
MODEL_REWARD_MEAN = Gauge(
    "agent_rl_model_reward_mean",
    "Mean reward of a model version over the deployment monitor's window.",
    ["lineage", "model_version"],
    multiprocess_mode="mostrecent",
)
MODEL_BENCHMARK_SCORE = Gauge(
    "agent_rl_model_benchmark_score",
    "Validation/benchmark score of a model version by task type (0-1).",
    ["lineage", "model_version", "task_type"],
    multiprocess_mode="mostrecent",
)

# Trajectories
TRAJECTORIES = Counter(
    "agent_rl_trajectories_collected_total",
    "Trajectories received by the reward service.",
    ["agent_type", "task_domain"],
)
TRAJECTORY_LENGTH = Histogram(
    "agent_rl_trajectory_length_turns",
    "Number of turns in a trajectory.",
    buckets=(1, 3, 5, 10, 20, 50),
)
TRAJECTORY_REWARD = Histogram(
    "agent_rl_trajectory_reward",
    "Total reward of a trajectory, per serving model version.",
    ["lineage", "model_version"],
    # the seed's buckets; rewards <= 0 fall in le="0.0" (a negative lowest bucket would make
    # prometheus_client drop _sum, and the mean reward per version needs it)
    buckets=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
)
TRAJECTORY_SUCCESS = Counter(
    "agent_rl_trajectory_success_total",
    "Trajectories whose outcome was a success, per serving model version.",
    ["lineage", "model_version"],
)
REWARD_COMPONENT = Histogram(
    "agent_rl_reward_component",
    "Value of each reward component (task completion, efficiency, code quality, feedback).",
    ["component"],
    buckets=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
)

# Deployments
MODEL_DEPLOYMENTS = Counter(
    "agent_rl_model_deployments_total",
    "Deployment state changes (canary, promoted, rolled_back, failed), per lineage.",
    ["lineage", "status"],
)
MODEL_TRAFFIC_RATIO = Gauge(
    "agent_rl_model_traffic_ratio",
    "Share of its lineage's traffic (public model name) routed to a version (0-1).",
    ["lineage", "model_version"],
    multiprocess_mode="mostrecent",
)

# ---- what operators need beyond the seed -------------------------------------------------

GATEWAY_REQUESTS = Counter(
    "agent_rl_gateway_requests_total",
    "Chat completion requests served by the gateway, per model version.",
    ["lineage", "model_version"],
)
GATEWAY_ERRORS = Counter(
    "agent_rl_gateway_errors_total",
    "Chat completion requests that failed, per model version (error rate = errors/requests).",
    ["lineage", "model_version"],
)
GATEWAY_LATENCY = Histogram(
    "agent_rl_gateway_request_duration_seconds",
    "Gateway request latency per model version.",
    ["lineage", "model_version"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
REWARD_LATENCY = Histogram(
    "agent_rl_reward_latency_seconds",
    "Reward service: time to validate, score and commit one batch of trajectories.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
REWARDS_PUBLISHED = Counter(
    "agent_rl_rewards_published_total",
    "Rewards published by the reward service.",
)
BUS_PUBLISHED = Counter(
    "agent_rl_bus_published_messages_total",
    "Messages published to JetStream (acknowledged), per subject.",
    ["subject"],
)
BUS_CONSUMED = Counter(
    "agent_rl_bus_consumed_messages_total",
    "Messages handled and acknowledged, per durable consumer.",
    ["consumer"],
)
BUS_DEAD_LETTERS = Counter(
    "agent_rl_bus_dead_letters_total",
    "Messages sent to the dead-letter stream, per original subject.",
    ["subject"],
)
BUS_CONSUMER_PENDING = Gauge(
    "agent_rl_bus_consumer_pending_messages",
    "Consumer lag: messages in the stream not yet delivered to the consumer.",
    ["stream", "consumer"],
    multiprocess_mode="mostrecent",
)
BUS_CONSUMER_ACK_PENDING = Gauge(
    "agent_rl_bus_consumer_ack_pending_messages",
    "Messages delivered to the consumer and not yet acknowledged.",
    ["stream", "consumer"],
    multiprocess_mode="mostrecent",
)
BUS_CONSUMER_REDELIVERED = Gauge(
    "agent_rl_bus_consumer_redelivered_messages",
    "Messages currently redelivered (delivered more than once) to the consumer.",
    ["stream", "consumer"],
    multiprocess_mode="mostrecent",
)
BUS_STREAM_MESSAGES = Gauge(
    "agent_rl_bus_stream_messages",
    "Messages stored in a JetStream stream.",
    ["stream"],
    multiprocess_mode="mostrecent",
)
BUS_STREAM_BYTES = Gauge(
    "agent_rl_bus_stream_bytes",
    "Bytes stored in a JetStream stream.",
    ["stream"],
    multiprocess_mode="mostrecent",
)
WAREHOUSE_BATCH_ROWS = Histogram(
    "agent_rl_warehouse_insert_batch_rows",
    "Rows per warehouse insert batch.",
    ["table"],
    buckets=(1, 10, 50, 100, 500, 1000, 5000, 10000),
)
WAREHOUSE_INSERT_LATENCY = Histogram(
    "agent_rl_warehouse_insert_duration_seconds",
    "Time to insert one batch into the warehouse.",
    ["table"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
WAREHOUSE_ROWS = Counter(
    "agent_rl_warehouse_rows_inserted_total",
    "Rows inserted into the warehouse, per table.",
    ["table"],
)
COLLECTOR_ERRORS = Counter(
    "agent_rl_metrics_collector_errors_total",
    "Metric collectors that failed (logged and skipped), per collector.",
    ["collector"],
)
COLLECTOR_LAST_SUCCESS = Gauge(
    "agent_rl_metrics_collector_last_success_timestamp_seconds",
    "Unix time of a collector's last successful run.",
    ["collector"],
    multiprocess_mode="mostrecent",
)

# The metric names the dashboards and rules may use (checked by the tests).
ALL_METRICS: tuple[Any, ...] = tuple(
    obj for obj in list(globals().values()) if isinstance(obj, Counter | Gauge | Histogram)
)


def switch_to_multiprocess() -> None:
    """Called by `multiproc.enable_multiprocess` when this module was imported first (as
    `import agentrl` does): rebuild every metric's value storage on the memory-mapped files.
    Samples recorded before the switch are dropped (there are none at a service's start)."""
    global MULTIPROCESS
    import sys

    instrument = sys.modules.get("agentrl.observability.instrument")
    if instrument is not None:  # its cached label children point at the old storage
        instrument._clear_children()
    _values.ValueClass = _values.get_value_class()
    for metric in ALL_METRICS:
        if metric._labelnames:
            with metric._lock:
                metric._metrics = {}
        else:
            metric._metric_init()
    MULTIPROCESS = True
    initialise_families()


def metric_names() -> set[str]:
    """Every exported series family name, with the suffixes Prometheus adds."""
    names: set[str] = set()
    for m in ALL_METRICS:
        base = m._name
        if isinstance(m, Counter):
            names.add(f"{base}_total")
        elif isinstance(m, Histogram):
            names.update({f"{base}_bucket", f"{base}_sum", f"{base}_count"})
        else:
            names.add(base)
    return names


# ---- registry and exposition ---------------------------------------------------------------


def registry() -> CollectorRegistry:
    """The registry `/metrics` exposes: the process registry, or in multiprocess mode a fresh
    one that merges every process's files (the documented prometheus_client pattern)."""
    if not MULTIPROCESS:
        return REGISTRY
    from prometheus_client import multiprocess

    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)
    return merged


def exposition() -> bytes:
    """The text format of every metric (what `/metrics` returns)."""
    return generate_latest(_Evicting(registry()))  # type: ignore[arg-type]


class _Evicting:
    """Leaves out the series of evicted versions. `versions_changed` removes them from this
    process's metrics, but in multiprocess mode (`agentrl up`) the memory-mapped files keep
    them; the scrape drops them here. Inactive until this process has seen a split."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        labelled = MODEL_VERSION.labelled()
        names = {metric._name for metric in VERSION_FAMILIES}
        for family in self.source.collect():
            if labelled and family.name in names:
                family.samples = [
                    s
                    for s in family.samples
                    if s.labels.get("model_version", OTHER) in labelled
                    or s.labels.get("model_version") == OTHER
                ]
            yield family


def mark_process_dead(pid: int) -> None:
    """A job child process exited: drop its live gauges (multiprocess mode only)."""
    if MULTIPROCESS:
        from prometheus_client import multiprocess

        with contextlib.suppress(Exception):
            multiprocess.mark_process_dead(pid)


# ---- never-failing recording helpers -----------------------------------------------------

_errors = [0]


@contextlib.contextmanager
def safe() -> Iterator[None]:
    """Run a recording block; any error is logged once per 100 and never propagates."""
    try:
        yield
    except Exception:  # a metric must never break the service that records it
        _errors[0] += 1
        if _errors[0] % 100 == 1:
            log.exception("recording a metric failed (%d so far)", _errors[0])


def inc(counter: Counter, amount: float = 1.0, **labels: str) -> None:
    """`counter.labels(**labels).inc(amount)` that cannot raise and respects `enabled()`."""
    if _DISABLED[0]:
        return
    with safe():
        (counter.labels(**labels) if labels else counter).inc(amount)


def observe(hist: Histogram, value: float, **labels: str) -> None:
    if _DISABLED[0]:
        return
    with safe():
        (hist.labels(**labels) if labels else hist).observe(value)


def set_gauge(gauge: Gauge, value: float, **labels: str) -> None:
    if _DISABLED[0]:
        return
    with safe():
        (gauge.labels(**labels) if labels else gauge).set(value)


def record_gateway_request(version: str, duration_s: float, error: bool) -> None:
    """One gateway request: count, latency, and the error count (error rate in PromQL)."""
    if _DISABLED[0]:
        return
    with safe():
        labels = version_labels(version)
        GATEWAY_REQUESTS.labels(**labels).inc()
        GATEWAY_LATENCY.labels(**labels).observe(duration_s)
        if error:
            GATEWAY_ERRORS.labels(**labels).inc()


def record_trajectory(
    agent_type: str, task_domain: str, turns: int, reward: float | None, model_version: str,
    success: bool | None = None,
) -> None:  # fmt: skip
    """One scored trajectory (reward service)."""
    if _DISABLED[0]:
        return
    with safe():
        TRAJECTORIES.labels(
            agent_type=AGENT_TYPE(agent_type), task_domain=TASK_DOMAIN(task_domain)
        ).inc()
        TRAJECTORY_LENGTH.observe(turns)
        labels = version_labels(model_version)
        if reward is not None:
            TRAJECTORY_REWARD.labels(**labels).observe(reward)
        if success:
            TRAJECTORY_SUCCESS.labels(**labels).inc()


def record_dead_letter(subject: str) -> None:
    inc(BUS_DEAD_LETTERS, subject=SUBJECT(subject))


def record_training_status(status: str, lineage: str | None = None) -> None:
    inc(TRAINING_JOBS, lineage=_lineage(lineage), status=STATUS(status))


def record_deployment(status: str, lineage: str | None = None) -> None:
    """A deployment state change of `lineage` (None: the default one)."""
    lin = _lineage(lineage)
    if lin not in _lineages_seen:  # its statuses at zero from now on, as the default's
        lineage_seen(lin)
    inc(MODEL_DEPLOYMENTS, lineage=lin, status=STATUS(status))


def _lineage(name: str | None) -> str:
    return LINEAGE(name or DEFAULT_LINEAGE[0])


_lineages_seen: set[str] = set()


def lineage_seen(lineage: str) -> None:
    """Children at zero for a lineage's job and deployment statuses (`rate()` and
    `absent()` work from its first event on)."""
    with safe():
        lin = _lineage(lineage)
        _lineages_seen.add(lin)
        for status in JOB_STATUSES:
            TRAINING_JOBS.labels(lineage=lin, status=STATUS(status))
        for status in DEPLOY_STATUSES:
            MODEL_DEPLOYMENTS.labels(lineage=lin, status=STATUS(status))


# ---- label values known up front ----------------------------------------------------------

JOB_STATUSES = ("queued", "started", "running", "completed", "failed", "cancelled")
DEPLOY_STATUSES = ("deployed", "canary", "promoted", "rolled_back", "rejected")
TASK_DOMAINS = ("coding", "research", "data_analysis", "general", "debugging", "writing")
# the seed's benchmark task types (deploy.validation.TASK_TYPES; a test keeps them equal)
BENCHMARK_TASK_TYPES = ("tool_usage", "code_generation", "data_analysis", "research_synthesis")


def initialise_families() -> None:
    """Children at zero for every label value known before the first event."""
    with safe():
        for lineage in {DEFAULT_LINEAGE[0], *_lineages_seen}:
            lineage_seen(lineage)
        for domain in TASK_DOMAINS:
            TRAJECTORIES.labels(agent_type=AGENT_TYPE("agent"), task_domain=TASK_DOMAIN(domain))
        versions_changed(sorted(MODEL_VERSION.labelled()), [])


# the families labelled by model_version (evicted together)
VERSION_FAMILIES: tuple[Any, ...] = (
    MODEL_REWARD_MEAN,
    MODEL_BENCHMARK_SCORE,
    TRAJECTORY_REWARD,
    TRAJECTORY_SUCCESS,
    MODEL_TRAFFIC_RATIO,
    GATEWAY_REQUESTS,
    GATEWAY_ERRORS,
    GATEWAY_LATENCY,
)


def versions_changed(new: list[str], evicted: list[str]) -> None:
    """Initialise the per-version families for `new` versions (counters and histograms at
    zero, the mean reward and benchmark scores NaN: not measured yet) and remove every series
    of the `evicted` ones."""
    if not new and not evicted:
        return
    with safe():
        instrument = sys.modules.get("agentrl.observability.instrument")
        if instrument is not None:  # cached children may belong to evicted or "other" labels
            instrument._clear_children()
        gone = set(evicted)
        for metric in VERSION_FAMILIES:
            index = list(metric._labelnames).index("model_version")
            with metric._lock:
                stale = [k for k in metric._metrics if k[index] in gone]
            for key in stale:
                with contextlib.suppress(KeyError):
                    metric.remove(*key)
        for v in new:
            labels = {"lineage": lineage_of(v), "model_version": v}
            TRAJECTORY_REWARD.labels(**labels)
            TRAJECTORY_SUCCESS.labels(**labels)
            GATEWAY_REQUESTS.labels(**labels)
            GATEWAY_ERRORS.labels(**labels)
            GATEWAY_LATENCY.labels(**labels)
            MODEL_REWARD_MEAN.labels(**labels).set(math.nan)
            for task in BENCHMARK_TASK_TYPES:
                MODEL_BENCHMARK_SCORE.labels(**labels, task_type=TASK_TYPE(task)).set(math.nan)


initialise_families()
