"""`agentrl report --out DIR`: an HTML page that leads with the result of the loop.

The page, top to bottom:
1. held-out success per version with 95 % intervals: the final table of `agentrl loop` as
   a plot (base, each version, the live one marked). The loop passes its rows
   (`write_report(data, out, heldout=rows)`), which are also written to `heldout.json`
   beside index.html so `agentrl report --out DIR` draws them again; without held-out rows
   one line says so and the page starts with the lineage;
2. the lineage of each version: data window -> reward version -> training job ->
   checkpoint -> validation -> canary steps -> decision, from the training requests and
   statuses (RL_TRAINING), the deployment and validation events (RL_MODELS) and the model
   registry (KV bucket); "n/a" where none of them carries the value;
3. with two lineages or more (`agentrl.release.lineage`: a public model name per agent, each
   with its own versions, canaries and rollbacks), a section per lineage: its versions, live
   version, held-out result, promotions, rollbacks, rewards and jobs, and the reward curve
   of each lineage (a line per lineage); the version table is grouped by lineage;
4. the supporting plots: reward and success on training traffic (sampled at the agents'
   exploring temperature, not held-out), training metrics per job, canary traffic, reward
   components. Time axes count seconds since the first event of the report.

Data comes from the streams, read from a start time with ephemeral consumers that are
deleted afterwards (nothing is left behind, nothing is replayed from the beginning), and
from the registry's bucket when it exists (it is never created here). The pure part
(`*_rows`, `lineage_rows`, the plots, `html_page`) takes plain dicts, so it can be fed
from a file as well.

Every supporting plot is always written (an empty one says "no data yet"), so the page never
shows a broken image; the page checks its own images on load and records the result in the
DOM (`data-images-ok`, `data-broken`), which the headless-browser test reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html as htmllib
import json
import logging
import re
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

HELDOUT_PLOT = ("heldout_success.png", "Held-out success per version")
HELDOUT_FILE = "heldout.json"
PLOTS = (
    ("reward_over_time.png", "Reward on training traffic per version"),
    ("success_rate.png", "Success on training traffic per version"),
    ("training_curves.png", "Training metrics, job after job"),
    ("canary_traffic.png", "Traffic share per version, with rollbacks"),
    ("reward_components.png", "Reward component distributions"),
)
CAPTIONS = {
    PLOTS[0][0]: "Every reward of the agents' traffic while the loop ran, by the version that "
    "acted; the agents sample at their exploring temperature, so this is not held-out success.",
    PLOTS[1][0]: "Share of the training traffic's episodes that completed the task, per version "
    "(exploring temperature: low for every version; the held-out plot above is the result).",
    PLOTS[2][0]: "Each job's loss and its batch's mean reward at its reported steps, the jobs in "
    "the order they ran.",
    PLOTS[3][0]: "Canary steps, promotions and rollbacks: each version's share of the traffic "
    "(the live version keeps the rest).",
    PLOTS[4][0]: "The reward's components over all rewards of the report.",
}
CAPTIONS[HELDOUT_PLOT[0]] = (
    "Each version played the same held-out tasks greedily (none of them was in its training "
    "data); the bar is its success, the whisker its 95 % Wilson interval, the framed green bar "
    "the version live at the end."
)
SUCCESS_COMPONENT = "task_completion"
SEVERAL_VERSIONS = "several versions"  # the model of a reward whose trajectory names none
NA = "n/a"
# A version's deciding action (the registry's audit trail) as the page names it.
DECISIONS = {
    "promote": "promoted",
    "rollback": "rolled back",
    "reject": "rejected",
    "supersede": "superseded",
    "bootstrap": "base (served first)",
    "refuse_to_serve": "refused to serve",
}
COLORS = {"promoted": "tab:blue", "rolled back": "tab:red", "rejected": "tab:red"}
LINEAGE_PLOT = ("reward_per_lineage.png", "Reward on training traffic per lineage")
CAPTIONS[LINEAGE_PLOT[0]] = (
    "Every reward of the agents' traffic, by the lineage of the version that acted (a line "
    "per lineage, rolling mean; exploring temperature, not held-out)."
)
DEFAULT_LINEAGE = "agentrl-policy"  # DeploySettings.public_model's default
# a version id is `<lineage>-vN` or `<lineage>-base` (`agentrl.release.actions`)
_VERSION_SUFFIX = re.compile(r"-(?:v\d+|base)$")


@dataclass
class ReportData:
    rewards: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    deployments: list[dict[str, Any]] = field(default_factory=list)  # deployed + validated
    requests: list[dict[str, Any]] = field(default_factory=list)  # training requests
    registry: list[dict[str, Any]] = field(default_factory=list)  # model records
    source: str = "streams"
    default_lineage: str = DEFAULT_LINEAGE  # the lineage of a version whose id names none


# ---- reading -----------------------------------------------------------------------------


async def read_stream(bus: Any, stream: str, since: datetime, limit: int = 200_000) -> list[dict]:
    """Every JSON message of `stream` from `since`, through an ephemeral consumer that is
    deleted at the end."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.BY_START_TIME,
        opt_start_time=since.astimezone(UTC),
        ack_policy=AckPolicy.NONE,
        inactive_threshold=30.0,
    )
    info = await bus.js.stream_info(stream)
    if not info.state.messages:
        return []
    subjects = info.config.subjects or [">"]
    sub = await bus.js.pull_subscribe(
        subjects[0] if len(subjects) == 1 else ">", durable=None, stream=stream, config=config
    )
    out: list[dict] = []
    try:
        while len(out) < limit:
            try:
                msgs = await sub.fetch(500, timeout=0.5)
            except TimeoutError:
                break
            for msg in msgs:
                try:
                    out.append(json.loads(msg.data))
                except ValueError:
                    continue
            if msgs and msgs[-1].metadata.num_pending == 0:
                break
    finally:
        try:
            name = (await sub.consumer_info()).name
            await sub.unsubscribe()
            await bus.js.delete_consumer(stream, name)
        except Exception as exc:  # it expires by itself after inactive_threshold
            log.debug("could not delete the report's consumer on %s: %r", stream, exc)
    return out


async def read_registry(bus: Any, bucket: str | None = None) -> list[dict[str, Any]]:
    """The model records of the registry's bucket, or none when there is no bucket (it is
    not created here)."""
    import nats.js.errors

    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry

    bucket = bucket or DeploySettings().bucket
    try:
        kv = await bus.js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        return []
    records = await Registry(kv, bucket).list_models()
    return [r.model_dump(mode="json") for r in records]


async def load_from_streams(
    bus: Any, since: datetime, registry_bucket: str | None = None
) -> ReportData:
    data = ReportData(source="streams")
    for stream, attr in (
        ("RL_REWARDS", "rewards"),
        ("RL_TRAINING", "statuses"),
        ("RL_MODELS", "deployments"),
    ):
        try:
            rows = await read_stream(bus, stream, since)
        except Exception as exc:
            if type(exc).__name__ != "NotFoundError":
                raise
            rows = []
        if attr == "statuses":
            data.requests = [r for r in rows if "training_job_id" in r and "training_config" in r]
            rows = [r for r in rows if "training_job_id" in r and "status" in r]
        setattr(data, attr, rows)
    data.registry = await read_registry(bus, registry_bucket)
    from agentrl.serving.config import DeploySettings

    data.default_lineage = DeploySettings().public_model
    return data


def heldout_rows(rows: Sequence[Any] | None) -> list[dict[str, Any]]:
    """The loop's rows (`VersionRow`s or their dicts) as plain JSON-able dicts."""
    out = []
    for row in rows or ():
        if dataclasses.is_dataclass(row) and not isinstance(row, type):
            row = dataclasses.asdict(row)
        out.append(json.loads(json.dumps(dict(row), default=str)))
    return out


def read_heldout(out: Path) -> list[dict[str, Any]] | None:
    """`out/heldout.json`'s rows, or None when there is no such file."""
    path = out / HELDOUT_FILE
    if not path.exists():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    return heldout_rows(doc.get("rows") if isinstance(doc, dict) else doc)


# ---- frames (pure) ------------------------------------------------------------------------


def _ts(value: Any) -> float:
    if isinstance(value, int | float):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


def _dig(doc: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def reward_rows(events: list[dict]) -> list[dict[str, Any]]:
    """One row per reward (the highest version per trajectory wins), with its model version."""
    latest: dict[str, dict] = {}
    for ev in events:
        key = str(ev.get("trajectory_id", ev.get("reward_id")))
        version = _dig(ev, "metadata", "version") or 1
        if key not in latest or version >= (_dig(latest[key], "metadata", "version") or 1):
            latest[key] = ev
    rows = []
    for ev in latest.values():
        comps = {
            name: float(c.get("score", 0.0))
            for name, c in (ev.get("reward_components") or {}).items()
            if isinstance(c, dict)
        }
        rows.append(
            {
                "ts": _ts(ev.get("timestamp")),
                # no single version: a trajectory several versions played (credited to none)
                "model": _credited(_dig(ev, "metadata", "model")),
                "reward": float(ev.get("total_reward", 0.0)),
                "success": comps.get(SUCCESS_COMPONENT, 0.0) >= 1.0,
                "components": comps,
                "version": _dig(ev, "metadata", "version"),
                "calculator": _dig(ev, "metadata", "calculator_version"),
            }
        )
    return sorted(rows, key=lambda r: r["ts"])


def status_rows(events: list[dict]) -> list[dict[str, Any]]:
    rows = []
    for ev in events:
        cur = _dig(ev, "metrics", "current") or {}
        rows.append(
            {
                "ts": _ts(ev.get("timestamp")),
                "job": str(ev.get("training_job_id")),
                "status": str(ev.get("status")),
                "step": int(_dig(ev, "progress", "current_step") or 0),
                "reward_mean": cur.get("reward_mean"),
                "loss": cur.get("loss"),
                "dataset": _dig(ev, "metadata", "dataset"),
                "train_s": _dig(ev, "resource_usage", "total_training_time_seconds"),
                "lineage": _dig(ev, "metadata", "lineage"),  # absent: the default lineage's
            }
        )
    return sorted(rows, key=lambda r: r["ts"])


def _action(ev: dict) -> str | None:
    action = _dig(ev, "metadata", "action")
    if action:
        return str(action)
    text = json.dumps(ev).lower()  # events of other publishers: a status word in the text
    return "rollback" if "rolled_back" in text or "rollback" in text else None


def deployment_rows(events: list[dict]) -> list[dict[str, Any]]:
    """The deployed events: one row per step, promotion or rollback."""
    rows = []
    for ev in events:
        if "deployment_config" not in ev:
            continue
        version = (
            _dig(ev, "deployment_config", "model_version")
            or _dig(ev, "metadata", "model_version")
            or _dig(ev, "model_info", "version")
            or _dig(ev, "model_info", "model_id")
        )
        action = _action(ev)
        rows.append(
            {
                "ts": _ts(ev.get("timestamp")),
                "model": str(version),
                "traffic": float(_dig(ev, "deployment_config", "traffic_percentage") or 0.0) / 100,
                "rollback": action == "rollback",
                "action": action,
                "previous": _dig(ev, "metadata", "previous_model"),
                "job": ev.get("training_job_id"),
                "checkpoint": _dig(ev, "model_info", "checkpoint_path"),
                "validation": ev.get("validation_results"),
                "reason": _dig(ev, "metadata", "reason"),
            }
        )
    return sorted(rows, key=lambda r: r["ts"])


def _origin(data: ReportData) -> float | None:
    """The time axes' zero: the first event of the report (the registry's too)."""
    times = [_ts(e.get("timestamp")) for e in (*data.rewards, *data.statuses, *data.requests)]
    times += [_ts(e.get("timestamp")) for e in data.deployments if "timestamp" in e]
    times += [_ts(d.get("at")) for r in data.registry for d in r.get("decisions") or ()]
    return min(times) if times else None


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S")


def _short(model_id: str, prefix: str) -> str:
    return model_id[len(prefix) :] if prefix and model_id.startswith(prefix) else model_id


def _prefix(model_ids: list[str]) -> str:
    """The public name's prefix all versions share (agentrl-policy-), to label them short."""
    if not model_ids:
        return ""
    head = model_ids[0].rsplit("-", 1)[0] + "-" if "-" in model_ids[0] else ""
    return head if head and all(m.startswith(head) for m in model_ids) else ""


def decision_label(decision: str | None, state: str | None = None) -> str:
    """What happened to a version, in words: promoted / rolled back / rejected / held ..."""
    label = DECISIONS.get(decision or "", "held" if decision else NA)
    if state == "live":
        return "live" if label in ("held", NA) else f"{label}, live"
    if label == "held" and state in ("candidate", "canary"):
        return f"held ({state})"
    return label


def _record_decision(record: dict[str, Any]) -> tuple[str | None, str]:
    for d in reversed(record.get("decisions") or []):
        if d.get("action") in DECISIONS:
            return str(d["action"]), str(d.get("reason") or "")
    last = (record.get("decisions") or [None])[-1]
    return (str(last.get("action")), str(last.get("reason") or "")) if last else (None, "")


def _validation_text(results: dict[str, Any] | None, details: dict[str, Any] | None) -> str:
    if not results:
        return NA
    failed = [
        name
        for name, bad in (
            ("benchmark", not results.get("benchmark_passed", True)),
            ("safety", not results.get("safety_checks_passed", True)),
            ("regression", results.get("performance_regression", False)),
        )
        if bad
    ]
    text = "passed" if not failed else "failed: " + ", ".join(failed)
    mean = _dig(details, "benchmark", "mean")
    if isinstance(mean, int | float):
        text += f" (benchmark mean {mean:.2f})"
    return text


def _window(request: dict | None, statuses: list[dict], rewards: list[dict]) -> tuple[str, str]:
    """The job's data window (its request's date range, the counts its status reported) and
    the reward versions of the rewards in that window."""
    rng = _dig(request, "training_config", "dataset", "filter", "date_range")
    counts = next((s["dataset"] for s in reversed(statuses) if s.get("dataset")), None)
    lo = hi = None
    if isinstance(rng, dict) and rng.get("start") and rng.get("end"):
        lo, hi = _ts(rng["start"]), _ts(rng["end"])
    elif statuses:  # the job reads what was there when it started
        hi = statuses[0]["ts"]
    inside = [
        r for r in rewards if hi is not None and (lo is None or r["ts"] >= lo) and r["ts"] <= hi
    ]
    parts = []
    if inside:  # the rewarded trajectories its window holds, first to last
        parts.append(f"rewards of {_clock(inside[0]['ts'])}-{_clock(inside[-1]['ts'])} UTC")
    elif hi is not None:
        parts.append((f"{_clock(lo)}-" if lo is not None else "up to ") + f"{_clock(hi)} UTC")
    if isinstance(counts, dict):
        parts.append(
            f"{counts.get('trajectories', '?')} read, {counts.get('kept', '?')} kept, "
            f"{counts.get('sampled', '?')} sampled"
        )
    window = "; ".join(parts) or NA
    versions = sorted(
        {f"v{r['version']}" + (f" ({r['calculator']})" if r.get("calculator") else "")
         for r in inside if r.get("version") is not None}
    )  # fmt: skip
    return window, ", ".join(versions) or NA


def lineage_rows(
    data: ReportData, heldout: list[dict[str, Any]] | None = None
) -> list[dict[str, str]]:
    """One row per version: data window -> reward version -> training job -> checkpoint ->
    validation -> canary steps -> decision. Plain strings, "n/a" where no event carries it."""
    rewards = reward_rows(data.rewards)
    statuses = status_rows(data.statuses)
    deploys = deployment_rows(data.deployments)
    records = {str(r["model_id"]): r for r in data.registry if r.get("model_id")}
    validated = {
        str(e["model_id"]): e
        for e in data.deployments
        if "model_id" in e and "validation_results" in e
    }
    requests = {str(r["training_job_id"]): r for r in data.requests}
    order = sorted(records, key=lambda m: (records[m].get("version") or 0, m))
    for mid in [str(h.get("model_id")) for h in heldout or ()] + [d["model"] for d in deploys]:
        if mid not in order and mid != "None":
            order.append(mid)
    prefix = _prefix(order)
    held = {str(h.get("model_id")): h for h in heldout or ()}
    jobs_known = {s["job"] for s in statuses} | set(requests)
    rows = []
    for mid in order:
        rec = records.get(mid, {})
        mine = [d for d in deploys if d["model"] == mid and d["action"] != "rollback"]
        job = rec.get("training_job_id") or next(
            (d["job"] for d in mine if d["job"] in jobs_known), None
        )
        job_statuses = [s for s in statuses if s["job"] == job]
        window, reward_version = _window(requests.get(str(job)), job_statuses, rewards)
        ckpt = rec.get("checkpoint_path") or next((d["checkpoint"] for d in mine), None)
        if rec and not rec.get("checkpoint_path"):
            ckpt_text = f"base weights ({rec.get('base_model', '?')})"
        elif ckpt and not str(ckpt).startswith("base:"):
            tail = "/".join(Path(str(ckpt)).parts[-2:]).lstrip("/")
            sha = rec.get("sha256")
            ckpt_text = f".../{tail}" + (f" sha256 {sha[:12]}" if sha else "")
        else:
            ckpt_text = f"base weights ({str(ckpt)[5:]})" if ckpt else NA
        val = validated.get(mid, {})
        validation = _validation_text(
            rec.get("validation_results") or val.get("validation_results")
            or next((d["validation"] for d in mine), None),
            rec.get("validation_details") or val.get("details"),
        )  # fmt: skip
        if rec.get("decisions") and any(d.get("action") == "reject" for d in rec["decisions"]):
            validation = "failed: " + next(
                d.get("reason", "") for d in rec["decisions"] if d.get("action") == "reject"
            )
        steps = [d for d in mine if d["action"] in ("step", None)]
        canary = " \u2192 ".join(f"{d['traffic'] * 100:g} %" for d in steps) or NA
        ended = [
            d for d in deploys
            if (d["action"] == "promote" and d["model"] == mid)
            or (d["action"] == "rollback" and d["previous"] == mid)
        ]  # fmt: skip
        if steps and ended:
            canary += f" in {ended[0]['ts'] - steps[0]['ts']:.0f} s"
        decision, why = _record_decision(rec) if rec else (None, "")
        if decision is None:
            h = held.get(mid, {})
            decision, why = (h.get("decision") or None), str(h.get("why") or "")
            if decision is None and ended:
                decision, why = ended[-1]["action"], str(ended[-1]["reason"] or "")
        state = rec.get("state") or held.get(mid, {}).get("state")
        job_text = NA
        if job and job_statuses:
            last = job_statuses[-1]
            job_text = f"{str(job)[:8]} {last['status']}"
            if last.get("step"):
                job_text += f", {last['step']} steps"
            if isinstance(last.get("train_s"), int | float):
                job_text += f", {last['train_s']:.0f} s training"
        elif job:
            job_text = str(job)[:8]
        elif rec and not rec.get("checkpoint_path"):
            job_text = "none (base model)"
        rows.append(
            {
                "version": _short(mid, prefix),
                "model_id": mid,
                "data": window,
                "reward_version": reward_version,
                "job": job_text,
                "checkpoint": ckpt_text,
                "validation": validation,
                "canary": canary,
                "decision": decision_label(decision, state),
                "why": why,
            }
        )
    return rows


# ---- lineages (pure) ------------------------------------------------------------------------


def version_lineage(model_id: str, records: dict[str, dict], default: str) -> str:
    """The lineage of a version: its registry record's public name, else its id without the
    `-vN` / `-base` suffix, else (an id naming none) the default lineage."""
    public = (records.get(model_id) or {}).get("public_name")
    if public:
        return str(public)
    head = _VERSION_SUFFIX.sub("", model_id)
    return head if head and head != model_id else default


def lineages_of(data: ReportData, versions: Sequence[str]) -> dict[str, str]:
    """model_id -> its lineage, for `versions`, the registry's and the rewards' versions."""
    records = {str(r["model_id"]): r for r in data.registry if r.get("model_id")}
    ids = dict.fromkeys([*versions, *records])
    return {m: version_lineage(m, records, data.default_lineage) for m in ids}


def lineage_summaries(
    data: ReportData,
    rewards: list[dict],
    statuses: list[dict],
    deploys: list[dict],
    heldout: list[dict[str, Any]],
    provenance: list[dict[str, str]],
) -> list[dict[str, Any]]:
    """One row per lineage (in the order its versions first appear): its versions, the live
    one, its held-out result, promotions and rollbacks (the registry's audit trail, else the
    deployment events), the rewards of its versions' traffic and its training jobs."""
    credited = per_version(rewards)[0]
    of = lineages_of(
        data,
        [r["model_id"] for r in provenance]
        + [str(h.get("model_id")) for h in heldout]
        + [r["model"] for r in credited],
    )
    records = {str(r["model_id"]): r for r in data.registry if r.get("model_id")}
    held = {str(h.get("model_id")): h for h in heldout}
    names = list(dict.fromkeys(of[r["model_id"]] for r in provenance))
    names += [n for n in dict.fromkeys(of.values()) if n not in names]
    out = []
    for name in names:
        versions = [r["model_id"] for r in provenance if of.get(r["model_id"]) == name]
        mine = [m for m, lin in of.items() if lin == name]
        trail = [d for m in mine for d in (records.get(m) or {}).get("decisions") or ()]
        if trail:
            promotions = sum(d.get("action") == "promote" for d in trail)
            rollbacks = sum(d.get("action") == "rollback" for d in trail)
        else:
            promotions = sum(
                d["action"] == "promote" and of.get(d["model"]) == name for d in deploys
            )
            rollbacks = sum(d["rollback"] and of.get(d["model"]) == name for d in deploys)
        live = next((m for m in mine if (records.get(m) or {}).get("state") == "live"), None)
        live = live or next((m for m in mine if held.get(m, {}).get("state") == "live"), None)
        rs = [r["reward"] for r in credited if of.get(r["model"]) == name]
        jobs = {s["job"] for s in statuses if (s.get("lineage") or data.default_lineage) == name}
        rows = [held[m] for m in mine if m in held]
        out.append(
            {
                "lineage": name,
                "versions": versions or sorted(mine),
                "live": live or NA,
                "heldout": _headline(rows) if rows else NA,
                "promotions": promotions,
                "rollbacks": rollbacks,
                "rewards": len(rs),
                "mean_reward": sum(rs) / len(rs) if rs else None,
                "jobs": len(jobs),
            }
        )
    return out


# ---- plots --------------------------------------------------------------------------------


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(title: str, size: tuple[float, float] = (8, 4)) -> tuple[Any, Any]:
    import textwrap

    fig, ax = _plt().subplots(figsize=size, dpi=100)
    # a title with its left-out note ran past an 8-inch figure's right edge: two lines
    ax.set_title("\n".join(textwrap.wrap(title, int(size[0] * 9))))
    return fig, ax


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="png")
    _plt().close(fig)


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", fontsize=14, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _seconds_axis(ax: Any, t0: float) -> None:
    """Seconds since the first event, few ticks, the wall clock of zero in the label."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.set_xlabel(f"seconds since the first event ({_clock(t0)} UTC)")


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def heldout_label(row: dict[str, Any], decisions: dict[str, str] | None = None) -> str:
    """A held-out row's decision in the plot: the lineage table's word where it has one. The
    row's own is its state when the evaluation began: a candidate the deployment controller
    moved to canary meanwhile was "held (candidate)" under the plot, "held (canary)" in the
    table of the same report."""
    own = decision_label(row.get("decision"), row.get("state"))
    return (decisions or {}).get(str(row.get("model_id"))) or own.replace(NA, "")


def plot_heldout(
    rows: list[dict[str, Any]], path: Path, decisions: dict[str, str] | None = None
) -> None:
    """Held-out success per version with its 95 % interval; the live version marked (green,
    a star, its label in bold). `decisions`: model_id -> the lineage table's decision."""
    prefix = _prefix([str(r.get("model_id")) for r in rows])
    n = max((int(r.get("heldout_n") or 0) for r in rows), default=0)
    fig, ax = _figure(  # wider with more versions: each tick label keeps its own room
        f"{HELDOUT_PLOT[1]}: greedy, {n} held-out tasks each, 95 % interval",
        (max(9.0, 1.3 * len(rows)), 4.4),
    )
    ticks, live_at = [], None
    for i, r in enumerate(rows):
        mid = str(r.get("model_id"))
        label = heldout_label(r, decisions)
        ticks.append(f"{_short(mid, prefix)}\n{textwrap.fill(label, 14)}".strip())
        s = r.get("heldout_success")
        if s is None:
            ax.text(i, 0.04, "not\nevaluated", ha="center", va="bottom", color="grey", fontsize=9)
            continue
        live = r.get("state") == "live"
        live_at = i if live else live_at
        color = "tab:green" if live else COLORS.get(label.split(",")[0], "tab:grey")
        lo, hi = float(_or(r.get("ci_low"), s)), float(_or(r.get("ci_high"), s))
        ax.bar(i, s, width=0.6, color=color, alpha=0.85 if live else 0.55,
               edgecolor="black" if live else color, linewidth=2 if live else 0.5)  # fmt: skip
        ax.errorbar(i, s, yerr=[[s - lo], [hi - s]], color="black", capsize=6, lw=1.5)
        ax.plot(i, s, marker="*" if live else "o", ms=16 if live else 8, color=color,
                markeredgecolor="black", zorder=3)  # fmt: skip
        ax.text(i + 0.08, hi + 0.03, f"{s:.2f}", ha="center", va="bottom", fontsize=12,
                fontweight="bold" if live else "normal")  # fmt: skip
    ax.set_xticks(range(len(rows)), ticks)
    if live_at is not None:
        tick = ax.get_xticklabels()[live_at]
        tick.set_color("darkgreen")
        tick.set_fontweight("bold")
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylim(-0.03, 1.12)
    ax.set_ylabel("held-out success (greedy)")
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def _credited(model: Any) -> str:
    """The version a reward is credited to: none when its trajectory names none, or names
    "unknown" (what the loop's agents write for an episode two versions played)."""
    return str(model) if model and model != "unknown" else SEVERAL_VERSIONS


def per_version(rows: list[dict]) -> tuple[list[dict], int]:
    """The rows credited to one version, and how many were left out: a trajectory that
    several versions played belongs to no version's curve (it drew a line called "unknown"
    whose rolling mean jumped across the plot)."""
    mine = [r for r in rows if r["model"] != SEVERAL_VERSIONS]
    return mine, len(rows) - len(mine)


def _left_out(n: int) -> str:
    return f"; {n} played by several versions left out" if n else ""


def plot_reward_over_time(rows: list[dict], path: Path, t0: float) -> None:
    rows, left_out = per_version(rows)
    fig, ax = _figure(f"{PLOTS[0][1]} (rolling mean{_left_out(left_out)})")
    if not rows:
        _empty(ax, "rewards")
    for model in sorted({r["model"] for r in rows}):
        # in time order: a stream can hold a version's rewards out of it (a trajectory
        # rewarded again later), and the line would run back across the plot
        pts = sorted((r for r in rows if r["model"] == model), key=lambda r: r["ts"])
        window = max(1, len(pts) // 20)
        vals = [r["reward"] for r in pts]
        smooth = [
            sum(vals[max(0, i - window + 1) : i + 1]) / len(vals[max(0, i - window + 1) : i + 1])
            for i in range(len(vals))
        ]
        ax.plot([r["ts"] - t0 for r in pts], smooth, label=f"{model} (n={len(pts)})")
    if rows:
        ax.set_ylabel("reward (rolling mean)")
        ax.legend(loc="best", fontsize=8)
        _seconds_axis(ax, t0)
    _save(fig, path)


def _rolling(vals: list[float]) -> list[float]:
    window = max(1, len(vals) // 20)
    return [
        sum(vals[max(0, i - window + 1) : i + 1]) / len(vals[max(0, i - window + 1) : i + 1])
        for i in range(len(vals))
    ]


def plot_reward_per_lineage(
    rows: list[dict], lineage_of: dict[str, str], path: Path, t0: float
) -> None:
    """A line per lineage: the rolling mean reward of its versions' traffic, in time order
    (a reward credited to no single version is left out, as on the per-version plot)."""
    rows, left_out = per_version(rows)
    fig, ax = _figure(f"{LINEAGE_PLOT[1]} (rolling mean{_left_out(left_out)})")
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(lineage_of.get(r["model"], r["model"]), []).append(r)
    if not by:
        _empty(ax, "rewards")
    for name in sorted(by):
        pts = sorted(by[name], key=lambda r: r["ts"])
        versions = len({r["model"] for r in pts})
        ax.plot(
            [r["ts"] - t0 for r in pts],
            _rolling([r["reward"] for r in pts]),
            label=f"{name} (n={len(pts)}, {versions} version{'s' if versions > 1 else ''})",
        )
    if by:
        ax.set_ylabel("reward (rolling mean)")
        ax.legend(loc="best", fontsize=8)
        _seconds_axis(ax, t0)
    _save(fig, path)


def plot_success_rate(rows: list[dict], path: Path) -> None:
    rows, left_out = per_version(rows)
    fig, ax = _figure(f"{PLOTS[1][1]} (not held-out{_left_out(left_out)})")
    models = sorted({r["model"] for r in rows})
    if not models:
        _empty(ax, "rewards")
    else:
        counts = [sum(1 for r in rows if r["model"] == m) for m in models]
        rates = [
            sum(r["success"] for r in rows if r["model"] == m) / n
            for m, n in zip(models, counts, strict=True)
        ]
        # short names (base, v1, ...): the full ids ran into one another under the bars
        prefix = _prefix(models)
        ax.bar([_short(m, prefix) for m in models], rates, color="tab:olive")
        if prefix:
            ax.set_xlabel(f"version ({prefix}...)")
        for i, (rate, n) in enumerate(zip(rates, counts, strict=True)):
            ax.text(i, rate + 0.02, f"{rate:.2f} (n={n})", ha="center", fontsize=9)
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"share with {SUCCESS_COMPONENT} = 1")
    _save(fig, path)


def plot_training_curves(rows: list[dict], path: Path) -> None:
    """Loss and the batch's reward mean per step, the jobs one after another on one step
    axis (a job's metrics change from job to job more than within one)."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    fig.suptitle(PLOTS[2][1])
    curves = [r for r in rows if r["reward_mean"] is not None or r["loss"] is not None]
    if not curves:
        _empty(ax1, "training metrics")
        _empty(ax2, "training metrics")
        _save(fig, path)
        return
    jobs: list[str] = []
    for r in curves:
        if r["job"] not in jobs:
            jobs.append(r["job"])
    offset, ticks, labels = 0, [], []
    trail: dict[str, list[tuple[int, float]]] = {"loss": [], "reward_mean": []}
    for k, job in enumerate(jobs):
        pts: dict[int, dict] = {}
        for r in curves:
            if r["job"] == job:
                pts[r["step"]] = r  # the last event of a step wins (status repeats it)
        steps = sorted(pts)
        for ax, key in ((ax1, "loss"), (ax2, "reward_mean")):
            xy = [(offset + s, pts[s][key]) for s in steps if pts[s][key] is not None]
            trail[key] += xy
            if xy:
                ax.plot(*zip(*xy, strict=True), marker="o", color=f"C{k % 10}")
        ticks.append(offset + (steps[-1] if steps else 0))
        labels.append(f"job {k + 1}\n{job[:8]}")
        offset += (steps[-1] if steps else 0) + 1
    for ax, key, name in ((ax1, "loss", "loss"), (ax2, "reward_mean", "batch reward mean")):
        if len(trail[key]) > 1:  # job to job
            ax.plot(*zip(*trail[key], strict=True), color="grey", lw=0.8, zorder=0)
        ax.set_ylabel(name)
        ax.set_xticks(ticks, labels, fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_xlabel("last step of each job (steps of all jobs in order)")
    _save(fig, path)


def traffic_points(
    deploys: list[dict], registry: list[dict]
) -> dict[str, list[tuple[float, float]]]:
    """Traffic share per version over time: canary steps (the live version keeps the rest),
    promotions, rollbacks, and the registry's bootstrap of the base model."""
    pts: dict[str, list[tuple[float, float]]] = {}
    for rec in registry:
        for d in rec.get("decisions") or ():
            if d.get("action") == "bootstrap":
                pts.setdefault(str(rec["model_id"]), []).append((_ts(d.get("at")), 1.0))
    for d in deploys:
        if d["action"] == "rollback":
            pts.setdefault(d["model"], []).append((d["ts"], 1.0))
            if d["previous"]:
                pts.setdefault(str(d["previous"]), []).append((d["ts"], 0.0))
            continue
        share = 1.0 if d["action"] == "promote" else d["traffic"]
        pts.setdefault(d["model"], []).append((d["ts"], share))
        if d["previous"]:
            pts.setdefault(str(d["previous"]), []).append((d["ts"], 1.0 - share))
    return {m: sorted(p) for m, p in pts.items()}


def plot_canary(deploys: list[dict], registry: list[dict], path: Path, t0: float) -> None:
    fig, ax = _figure(PLOTS[3][1])
    pts = traffic_points(deploys, registry)
    if not pts:
        _empty(ax, "deployments")
        _save(fig, path)
        return
    end = max(t for p in pts.values() for t, _ in p)
    for model in sorted(pts):
        xs = [t - t0 for t, _ in pts[model]] + [end - t0]
        ys = [s * 100 for _, s in pts[model]]
        ax.step(xs, [*ys, ys[-1]], where="post", marker="o", markevery=range(len(ys)), label=model)
    for i, d in enumerate(d for d in deploys if d["rollback"]):
        ax.axvline(d["ts"] - t0, color="red", linestyle="--", label="rollback" if i == 0 else None)
    ax.set_ylim(-3, 105)
    ax.set_ylabel("traffic share (%)")
    ax.legend(loc="best", fontsize=8)
    _seconds_axis(ax, t0)
    _save(fig, path)


def plot_components(rows: list[dict], path: Path) -> None:
    fig, ax = _figure(PLOTS[4][1])
    names = sorted({n for r in rows for n in r["components"]})
    if not names:
        _empty(ax, "reward components")
    else:
        data = [[r["components"][n] for r in rows if n in r["components"]] for n in names]
        ax.boxplot(data, tick_labels=names, showmeans=True)
        ax.set_ylabel("score")
        ax.tick_params(axis="x", labelrotation=20)
    _save(fig, path)


# ---- page ---------------------------------------------------------------------------------

SELF_CHECK = """
<script>
window.__errors = [];
window.addEventListener("error", e => window.__errors.push(String(e.message || e.type)), true);
window.addEventListener("load", () => {
  const broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.getAttribute("src"));
  document.body.dataset.imagesOk = String(broken.length === 0 && document.images.length > 0);
  document.body.dataset.broken = broken.join(",");
  document.body.dataset.images = String(document.images.length);
  document.body.dataset.errors = window.__errors.join("|");
});
</script>
"""
STYLE = """body{font-family:sans-serif;margin:2em;max-width:1200px}figure{margin:1em 0}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}.headline{font-size:1.2em}
.muted{color:#666}"""
LINEAGE_COLUMNS = (
    ("version", "version"),
    ("data", "data window"),
    ("reward_version", "reward version"),
    ("job", "training job"),
    ("checkpoint", "checkpoint"),
    ("validation", "validation"),
    ("canary", "canary steps"),
    ("decision", "decision"),
)


def _figure_html(name: str, title: str, width: int = 800) -> str:
    esc = htmllib.escape
    return (
        f'<figure><img src="{esc(name)}" alt="{esc(title)}" width="{width}">'
        f'<figcaption class="muted">{esc(CAPTIONS.get(name, title))}</figcaption></figure>'
    )


def _headline(rows: list[dict[str, Any]]) -> str:
    """base x [lo, hi] -> live y [lo, hi] on n held-out tasks, in one sentence."""

    prefix = _prefix([str(r.get("model_id")) for r in rows])

    def one(r: dict[str, Any]) -> str:
        s, name = r.get("heldout_success"), _short(str(r.get("model_id")), prefix)
        if s is None:
            return f"{name} not evaluated"
        return f"{name} {s:.2f} [{_or(r.get('ci_low'), s):.2f}, {_or(r.get('ci_high'), s):.2f}]"

    base = next((r for r in rows if str(r.get("model_id", "")).endswith("-base")), None)
    live = next((r for r in rows if r.get("state") == "live"), None)
    n = max((int(r.get("heldout_n") or 0) for r in rows), default=0)
    parts = [one(base)] if base else []
    if live is not None and live is not base:
        parts.append(f"live: {one(live)}")
    return " &rarr; ".join(htmllib.escape(p) for p in parts) + f" (greedy, {n} held-out tasks)"


def html_page(
    data: ReportData,
    rewards: list[dict],
    statuses: list[dict],
    deploys: list[dict],
    heldout: list[dict[str, Any]] | None = None,
    lineage: list[dict[str, str]] | None = None,
    lineages: list[dict[str, Any]] | None = None,
) -> str:
    """The page. `lineage`: the version table's rows; `lineages`: one summary per lineage
    (`lineage_summaries`): with two or more, a section per lineage and the version table
    grouped by lineage."""
    esc = htmllib.escape
    several = lineages if lineages and len(lineages) > 1 else None
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    jobs = sorted({s["job"] for s in statuses})
    summary = [
        ("rewards", len(rewards)),
        ("model versions", len({r["model"] for r in per_version(rewards)[0]})),
        ("rewards of trajectories several versions played", per_version(rewards)[1]),
        ("training jobs", len(jobs)),
        ("failed jobs", len({s["job"] for s in statuses if s["status"] == "failed"})),
        ("deployment events", len(deploys)),
        ("rollbacks", sum(d["rollback"] for d in deploys)),
        ("lineages", len(lineages or ()) or 1),
    ]
    counts = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in summary)
    if heldout and several:  # each lineage's base -> live on its own held-out tasks
        result = "".join(
            f'<p class="headline" data-lineage="{esc(lin["lineage"])}"><b>'
            f"{esc(lin['lineage'])}</b>: {lin['heldout']}</p>"
            for lin in several
            if lin["heldout"] != NA
        ) + _figure_html(HELDOUT_PLOT[0], HELDOUT_PLOT[1], 900)
    elif heldout:
        result = f'<p class="headline">{_headline(heldout)}</p>' + _figure_html(
            HELDOUT_PLOT[0], HELDOUT_PLOT[1], 900
        )
    else:
        result = (
            '<p class="headline" id="no-heldout">No held-out results: this page was not '
            "written by <code>agentrl loop</code> and there is no heldout.json beside it.</p>"
        )
    head = "".join(f"<th>{esc(title)}</th>" for _, title in LINEAGE_COLUMNS)

    def cell(row: dict[str, str], key: str) -> str:
        if key == "decision" and row.get("why"):
            why = row["why"] if len(row["why"]) <= 70 else row["why"][:69] + "\u2026"
            return (
                f'<td title="{esc(row["why"])}"><b>{esc(row[key])}</b><br>'
                f'<small class="muted">{esc(why)}</small></td>'
            )
        return f"<td>{esc(row[key])}</td>"

    def row_html(row: dict[str, str]) -> str:
        return "<tr>" + "".join(cell(row, key) for key, _ in LINEAGE_COLUMNS) + "</tr>"

    if several:  # grouped: a lineage's header row, then its versions
        groups = [(lin["lineage"], set(lin["versions"])) for lin in several]
        body = "".join(
            f'<tr class="group"><th colspan="{len(LINEAGE_COLUMNS)}">lineage '
            f"{esc(name)}</th></tr>"
            + "".join(row_html(r) for r in lineage or () if r["model_id"] in versions)
            for name, versions in groups
        )
    else:
        body = "".join(row_html(row) for row in lineage or ())
    table = (
        f'<table id="lineage"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        if lineage
        else '<p id="lineage">No versions in the registry or the deployment events.</p>'
    )
    figures = "".join(_figure_html(name, title) for name, title in PLOTS)
    per_lineage = _lineages_html(several) if several else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agentrl report</title>
<style>{STYLE}</style>{SELF_CHECK}</head>
<body><h1>agentrl report</h1>
<p class="muted">Generated {esc(now)} from the {esc(data.source)}.</p>
<h2>Held-out success per version</h2>{result}{per_lineage}
<h2>Lineage of each version</h2>
<p class="muted">Data window &rarr; reward version &rarr; training job &rarr; checkpoint &rarr;
validation &rarr; canary steps &rarr; decision (hover a decision for its reason).</p>{table}
<h2>Supporting plots</h2>{figures}
<h2>Counts</h2><table>{counts}</table></body></html>
"""


LINEAGES_COLUMNS = (
    ("lineage", "lineage"),
    ("versions", "versions"),
    ("live", "live version"),
    ("heldout", "held-out (base \u2192 live)"),
    ("promotions", "promotions"),
    ("rollbacks", "rollbacks"),
    ("rewards", "rewards (mean)"),
    ("jobs", "training jobs"),
)


def _lineages_html(lineages: list[dict[str, Any]]) -> str:
    """The section per lineage: one row each, then the reward curve per lineage."""
    esc = htmllib.escape

    def cell(lin: dict[str, Any], key: str) -> str:
        value = lin[key]
        if key == "versions":
            prefix = f"{lin['lineage']}-"
            text = ", ".join(_short(v, prefix) for v in value) or NA
        elif key == "live":
            text = _short(str(value), f"{lin['lineage']}-")
        elif key == "rewards":
            mean = lin["mean_reward"]
            text = f"{value}" + (f" ({mean:.2f})" if mean is not None else "")
        elif key == "heldout":
            return f"<td>{value}</td>"  # built escaped by _headline
        else:
            text = str(value)
        return f"<td>{esc(text)}</td>"

    head = "".join(f"<th>{esc(title)}</th>" for _, title in LINEAGES_COLUMNS)
    body = "".join(
        f'<tr data-lineage="{esc(lin["lineage"])}">'
        + "".join(cell(lin, key) for key, _ in LINEAGES_COLUMNS)
        + "</tr>"
        for lin in lineages
    )
    return (
        '<h2>Per lineage</h2><p class="muted">Each agent\'s lineage: its own versions, canaries '
        "and rollbacks over the shared base model.</p>"
        f'<table id="lineages"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        + _figure_html(*LINEAGE_PLOT)
    )


def write_report(data: ReportData, out: Path, heldout: Sequence[Any] | None = None) -> Path:
    """Write the PNGs, index.html and (with held-out rows) heldout.json into `out`; returns
    the page's path."""
    out.mkdir(parents=True, exist_ok=True)
    held = heldout_rows(heldout)
    rewards = reward_rows(data.rewards)
    statuses = status_rows(data.statuses)
    deploys = deployment_rows(data.deployments)
    t0 = _origin(data) or time.time()
    lineage = lineage_rows(data, held)
    if held:
        (out / HELDOUT_FILE).write_text(
            json.dumps({"written": datetime.now(UTC).isoformat(), "rows": held}, indent=1),
            encoding="utf-8",
        )
        decided = {r["model_id"]: r["decision"] for r in lineage if r["decision"] != NA}
        plot_heldout(held, out / HELDOUT_PLOT[0], decided)
    plot_reward_over_time(rewards, out / PLOTS[0][0], t0)
    plot_success_rate(rewards, out / PLOTS[1][0])
    plot_training_curves(statuses, out / PLOTS[2][0])
    plot_canary(deploys, data.registry, out / PLOTS[3][0], t0)
    plot_components(rewards, out / PLOTS[4][0])
    lineages = lineage_summaries(data, rewards, statuses, deploys, held, lineage)
    if len(lineages) > 1:
        of = lineages_of(data, [r["model"] for r in rewards])
        plot_reward_per_lineage(rewards, of, out / LINEAGE_PLOT[0], t0)
    page = out / "index.html"
    page.write_text(
        html_page(data, rewards, statuses, deploys, held, lineage, lineages), encoding="utf-8"
    )
    return page


def run_report(
    out: Path, source: str = "auto", nats_url: str | None = None, hours: float = 24 * 7
) -> Path:
    """The CLI's entry: read the streams and the registry of the running stack (NATS_URL)
    and write the page, with the held-out rows of `out/heldout.json` when it is there."""
    from agentrl.bus.client import Bus
    from agentrl.core.errors import ConfigError

    if source not in ("auto", "streams"):
        raise ConfigError(
            f"report source {source!r} is not available: the warehouse is owned by the running "
            "ingester (read its numbers with GET /stats); use --source streams"
        )
    since = datetime.now(UTC) - timedelta(hours=hours)
    heldout = read_heldout(out)

    async def main() -> Path:
        bus = await Bus.connect(nats_url)
        try:
            data = await load_from_streams(bus, since)
        finally:
            await bus.close()
        return write_report(data, out, heldout=heldout)

    return asyncio.run(main())
