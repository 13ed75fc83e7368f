"""`agentrl report --out DIR`: an HTML page with PNG plots of what the loop did.

Plots: reward over time per model version, training curves per job, success rate per
version, canary traffic with rollback markers, reward component distributions.

Data comes from the streams (RL_REWARDS, RL_TRAINING, RL_MODELS), read from a start time
with ephemeral consumers that are deleted afterwards (nothing is left behind, nothing is
replayed from the beginning). The pure part (`frames`, `plots`, `html`) takes plain event
dicts, so it can be fed from the warehouse or a file as well.

Every plot is always written (an empty one says "no data yet"), so the page never shows a
broken image; the page checks its own images on load and records the result in the DOM
(`data-images-ok`, `data-broken`), which the headless-browser test reads.
"""

from __future__ import annotations

import asyncio
import html as htmllib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PLOTS = (
    ("reward_over_time.png", "Reward over time per model version"),
    ("training_curves.png", "Training curves per job"),
    ("success_rate.png", "Success rate per model version"),
    ("canary_traffic.png", "Canary traffic per version, with rollbacks"),
    ("reward_components.png", "Reward component distributions"),
)
SUCCESS_COMPONENT = "task_completion"


@dataclass
class ReportData:
    rewards: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    deployments: list[dict[str, Any]] = field(default_factory=list)
    source: str = "streams"


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


async def load_from_streams(bus: Any, since: datetime) -> ReportData:
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
            rows = [r for r in rows if "training_job_id" in r and "status" in r]
        setattr(data, attr, rows)
    return data


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
                "model": str(_dig(ev, "metadata", "model") or "unknown"),
                "reward": float(ev.get("total_reward", 0.0)),
                "success": comps.get(SUCCESS_COMPONENT, 0.0) >= 1.0,
                "components": comps,
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
            }
        )
    return sorted(rows, key=lambda r: r["ts"])


def _is_rollback(ev: dict) -> bool:
    text = json.dumps(ev).lower()
    return "rolled_back" in text or "rollback" in text


def deployment_rows(events: list[dict]) -> list[dict[str, Any]]:
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
        rows.append(
            {
                "ts": _ts(ev.get("timestamp")),
                "model": str(version),
                "traffic": float(_dig(ev, "deployment_config", "traffic_percentage") or 0.0) / 100,
                "rollback": _is_rollback(ev),
            }
        )
    return sorted(rows, key=lambda r: r["ts"])


# ---- plots --------------------------------------------------------------------------------


def _figure(title: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    ax.set_title(title)
    return fig, ax


def _save(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", fontsize=14, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _time_axis(ax: Any) -> None:
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _dates(ts: list[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t, UTC) for t in ts]


def plot_reward_over_time(rows: list[dict], path: Path) -> None:
    fig, ax = _figure(PLOTS[0][1])
    if not rows:
        _empty(ax, "rewards")
    for model in sorted({r["model"] for r in rows}):
        pts = [r for r in rows if r["model"] == model]
        window = max(1, len(pts) // 20)
        vals = [r["reward"] for r in pts]
        smooth = [
            sum(vals[max(0, i - window + 1) : i + 1]) / len(vals[max(0, i - window + 1) : i + 1])
            for i in range(len(vals))
        ]
        ax.plot(_dates([r["ts"] for r in pts]), smooth, label=f"{model} (n={len(pts)})")
    if rows:
        ax.set_ylabel("reward (rolling mean)")
        ax.legend(loc="best", fontsize=8)
        _time_axis(ax)
    _save(fig, path)


def plot_training_curves(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    fig.suptitle(PLOTS[1][1])
    curves = [r for r in rows if r["reward_mean"] is not None or r["loss"] is not None]
    if not curves:
        _empty(ax1, "training metrics")
        _empty(ax2, "training metrics")
    for job in sorted({r["job"] for r in curves}):
        pts = [r for r in curves if r["job"] == job]
        label = job[:8]
        rw = [(r["step"], r["reward_mean"]) for r in pts if r["reward_mean"] is not None]
        ls = [(r["step"], r["loss"]) for r in pts if r["loss"] is not None]
        if rw:
            ax1.plot(*zip(*rw, strict=True), marker=".", label=label)
        if ls:
            ax2.plot(*zip(*ls, strict=True), marker=".", label=label)
    if curves:
        ax1.set(xlabel="step", ylabel="reward mean")
        ax2.set(xlabel="step", ylabel="loss")
        ax1.legend(fontsize=8)
    _save(fig, path)


def plot_success_rate(rows: list[dict], path: Path) -> None:
    fig, ax = _figure(PLOTS[2][1])
    models = sorted({r["model"] for r in rows})
    if not models:
        _empty(ax, "rewards")
    else:
        rates = [
            sum(r["success"] for r in rows if r["model"] == m)
            / sum(1 for r in rows if r["model"] == m)
            for m in models
        ]
        ax.bar(models, rates, color="tab:green")
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"success rate ({SUCCESS_COMPONENT} = 1)")
    _save(fig, path)


def plot_canary(rows: list[dict], path: Path) -> None:
    fig, ax = _figure(PLOTS[3][1])
    if not rows:
        _empty(ax, "deployments")
    for model in sorted({r["model"] for r in rows}):
        pts = [r for r in rows if r["model"] == model]
        ax.step(
            _dates([r["ts"] for r in pts]),
            [r["traffic"] for r in pts],
            where="post",
            marker="o",
            label=model,
        )
    rollbacks = [r for r in rows if r["rollback"]]
    for i, r in enumerate(rollbacks):
        ax.axvline(
            _dates([r["ts"]])[0], color="red", linestyle="--", label="rollback" if i == 0 else None
        )
    if rows:
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("traffic ratio")
        ax.legend(loc="best", fontsize=8)
        _time_axis(ax)
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


def html_page(
    data: ReportData, rewards: list[dict], statuses: list[dict], deploys: list[dict]
) -> str:
    esc = htmllib.escape
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    jobs = sorted({s["job"] for s in statuses})
    summary = [
        ("rewards", len(rewards)),
        ("model versions", len({r["model"] for r in rewards})),
        ("training jobs", len(jobs)),
        ("failed jobs", len({s["job"] for s in statuses if s["status"] == "failed"})),
        ("deployment events", len(deploys)),
        ("rollbacks", sum(d["rollback"] for d in deploys)),
    ]
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in summary)
    figures = "".join(
        f'<figure><img src="{esc(name)}" alt="{esc(title)}" width="800">'
        f"<figcaption>{esc(title)}</figcaption></figure>"
        for name, title in PLOTS
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>agentrl report</title>
<style>body{{font-family:sans-serif;margin:2em}}figure{{margin:1em 0}}table{{border-collapse:collapse}}
th,td{{border:1px solid #ccc;padding:4px 10px;text-align:left}}</style>{SELF_CHECK}</head>
<body><h1>agentrl report</h1><p>Generated {esc(now)} from the {esc(data.source)}.</p>
<table>{rows}</table>{figures}</body></html>
"""


def write_report(data: ReportData, out: Path) -> Path:
    """Write the PNGs and index.html into `out`; returns the page's path."""
    out.mkdir(parents=True, exist_ok=True)
    rewards = reward_rows(data.rewards)
    statuses = status_rows(data.statuses)
    deploys = deployment_rows(data.deployments)
    plot_reward_over_time(rewards, out / PLOTS[0][0])
    plot_training_curves(statuses, out / PLOTS[1][0])
    plot_success_rate(rewards, out / PLOTS[2][0])
    plot_canary(deploys, out / PLOTS[3][0])
    plot_components(rewards, out / PLOTS[4][0])
    page = out / "index.html"
    page.write_text(html_page(data, rewards, statuses, deploys), encoding="utf-8")
    return page


def run_report(
    out: Path, source: str = "auto", nats_url: str | None = None, hours: float = 24 * 7
) -> Path:
    """The CLI's entry: read the streams of the running stack (NATS_URL) and write the page."""
    from agentrl.bus.client import Bus
    from agentrl.errors import ConfigError

    if source not in ("auto", "streams"):
        raise ConfigError(
            f"report source {source!r} is not available: the warehouse is owned by the running "
            "ingester (read its numbers with GET /stats); use --source streams"
        )
    since = datetime.now(UTC) - timedelta(hours=hours)

    async def main() -> Path:
        bus = await Bus.connect(nats_url)
        try:
            data = await load_from_streams(bus, since)
        finally:
            await bus.close()
        return write_report(data, out)

    return asyncio.run(main())
