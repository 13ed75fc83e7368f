"""`agentrl bench learning`: the shipped valid-action configuration, several training seeds
per algorithm (GiGPO, GRPO, RLOO), held-out greedy success per iteration with 95 %
intervals over seeds, and trainer seconds to reach 0.5 and 0.7.

Each (algorithm, seed) run is `agentrl learn` in its own process (`jobs` at a time), with
the same config, episode budget per iteration and time budget; only the advantage differs.
Held-out maps are the same 50 for every run and never trained on.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95 % t-interval over seeds (clipped to [0, 1]; a single seed: [mean, mean])."""
    x = np.asarray(values, dtype=float)
    m = float(x.mean()) if len(x) else float("nan")
    if len(x) < 2:
        return m, m, m
    half = T95.get(len(x) - 1, 1.96) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return m, max(0.0, m - half), min(1.0, m + half)


def curve(metrics: dict[str, Any]) -> list[tuple[float, float]]:
    """(trainer seconds, held-out success) at every held-out evaluation of one run."""
    pts = [(0.0, float(metrics["summary"]["base"]["success"]))]
    elapsed = 0.0
    for rec in metrics["iterations"]:
        elapsed += float(rec["rollout_s"]) + float(rec["update_s"])
        if rec.get("heldout_success") is not None:
            pts.append((elapsed, float(rec["heldout_success"])))
    return pts


def curve_by_iteration(metrics: dict[str, Any]) -> list[tuple[float, float]]:
    """(iteration, held-out success) at every held-out evaluation: independent of load."""
    pts = [(0.0, float(metrics["summary"]["base"]["success"]))]
    for rec in metrics["iterations"]:
        if rec.get("heldout_success") is not None:
            pts.append((float(rec["iteration"]), float(rec["heldout_success"])))
    return pts


def seconds_to(points: list[tuple[float, float]], level: float) -> float | None:
    for sec, succ in points:
        if succ >= level:
            return sec
    return None


def run_one(config: Path, algorithm: str, seed: int, out: Path, extra: list[str]) -> Any:
    cmd = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "learn",
        "--config",
        str(config),
        "--algorithm",
        algorithm,
        "--seed",
        str(seed),
        "--out",
        str(out),
        *extra,
    ]
    log = (out.parent / f"{out.name}.log").open("w")
    # A session of its own: the run is one unit to stop (its process group), and the
    # scheduler treats it as a job like any other on a shared machine (autogroup).
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def run_benchmark(
    config: Path,
    algorithms: list[str],
    seeds: int,
    jobs: int,
    out_dir: Path,
    extra: list[str],
    progress: Any = print,
    reuse: bool = False,
    collect_only: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    t0 = time.perf_counter()
    reuse = reuse or collect_only
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [(a, s) for s in range(seeds) for a in algorithms]
    running: list[tuple[str, int, Path, Any]] = []
    done: dict[tuple[str, int], dict[str, Any]] = {}
    while todo or running:
        while todo and len(running) < jobs:
            a, s = todo.pop(0)
            out = out_dir / f"{a}-seed{s}"
            if reuse and (out / "metrics.json").exists():
                done[(a, s)] = json.loads((out / "metrics.json").read_text())
                progress(f"reused {a} seed {s}: {done[(a, s)]['summary']['trained']['success']}")
                continue
            if collect_only:
                progress(f"{a} seed {s}: no finished run under {out}, left out")
                continue
            running.append((a, s, out, run_one(config, a, s, out, extra)))
            progress(f"started {a} seed {s}")
        if running:
            time.sleep(2)
        for item in list(running):
            a, s, out, proc = item
            if proc.poll() is None:
                continue
            running.remove(item)
            path = out / "metrics.json"
            if proc.returncode != 0 or not path.exists():
                progress(f"{a} seed {s} FAILED (exit {proc.returncode}); see {out}.log")
                continue
            done[(a, s)] = json.loads(path.read_text())
            progress(f"finished {a} seed {s}: {done[(a, s)]['summary']['trained']['success']}")
    rows: list[dict[str, Any]] = []
    figures: dict[str, Any] = {}
    curves: dict[str, list[list[tuple[float, float]]]] = {}
    for a in algorithms:
        runs = [done[(a, s)] for s in range(seeds) if (a, s) in done]
        finals = [float(r["summary"]["trained"]["success"]) for r in runs]
        pts = [curve(r) for r in runs]
        curves[a] = [curve_by_iteration(r) for r in runs]
        t50 = [seconds_to(p, 0.5) for p in pts]
        t70 = [seconds_to(p, 0.7) for p in pts]
        m, lo, hi = mean_ci(finals) if finals else (float("nan"),) * 3
        rows.append(
            {
                "algorithm": a,
                "seeds run": len(runs),
                "final held-out success": f"{m:.2f} [{lo:.2f}, {hi:.2f}]",
                "per seed": ", ".join(f"{f:.2f}" for f in finals),
                "s to 0.5 (median)": _median(t50),
                "s to 0.7 (median)": _median(t70),
                "reached 0.7": f"{sum(t is not None for t in t70)}/{len(runs)}",
            }
        )
        figures[a] = {
            "n": len(runs),
            "final": m,
            "ci": (lo, hi),
            "t50": _median(t50),
            "t70": _median(t70),
            "base": [float(r["summary"]["base"]["success"]) for r in runs],
        }
    _plot(curves, out_dir / "learning_curves.png")
    figures["wall_s"] = time.perf_counter() - t0
    return rows, figures


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    if not got or len(got) * 2 <= len(values):  # most seeds never got there: no median
        return None
    return round(float(np.median(got)), 1)


def _plot(curves: dict[str, list[list[tuple[float, float]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for a, runs in curves.items():
        if not runs:
            continue
        grid = np.linspace(0, max(p[-1][0] for p in runs), 40)
        ys = np.array([[_at(p, g) for g in grid] for p in runs])
        m = ys.mean(0)
        ax.plot(grid, m, label=f"{a} ({len(runs)} seeds)")
        if len(runs) > 1:
            half = T95.get(len(runs) - 1, 1.96) * ys.std(0, ddof=1) / math.sqrt(len(runs))
            ax.fill_between(grid, np.clip(m - half, 0, 1), np.clip(m + half, 0, 1), alpha=0.2)
    ax.set_xlabel("iteration (8 maps x 32 episodes each)")
    ax.set_ylabel("held-out greedy success (50 maps)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="upper left")
    ax.set_title("FrozenLake 4x4, valid-action SmolLM2: mean and 95% interval")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _at(points: list[tuple[float, float]], t: float) -> float:
    """The last held-out reading at or before trainer second `t` (a step curve)."""
    val = points[0][1]
    for sec, succ in points:
        if sec <= t:
            val = succ
    return val
