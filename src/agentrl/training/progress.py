"""What a job process reports while it runs: events appended to `events.jsonl`, progress with
an ETA, the current metrics, and the loss curves. Shared by both job kinds (`jobs.py`,
`choice_job.py`) and the process that runs them (`worker.py`), so none imports another."""

from __future__ import annotations

import json
import math
import resource
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.observability import instrument as obs


class Cancelled(Exception):
    """Raised inside the job when SIGTERM asked it to stop."""


class Emitter:
    """Appends events to events.jsonl (one JSON object per line, flushed at once)."""

    def __init__(self, path: Path) -> None:
        self.fh = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.cancel = threading.Event()
        self._work: list[Callable[[], int]] = []

    def count_work(self, probe: Callable[[], int]) -> None:
        """Add a counter that grows while the job works (optimiser steps, decode steps): the
        heartbeats carry the sum, and the service reads a sum that moved as progress."""
        self._work.append(probe)

    def work(self) -> int | None:
        """The counters' sum (None: none counted, or one failed while the job changes)."""
        try:
            return sum(int(p()) for p in self._work) if self._work else None
        except Exception:
            return None

    def emit(self, status: str, **fields: Any) -> None:
        fields = {k: v for k, v in fields.items() if v is not None}
        record = {"status": status, "t": time.time(), "peak_rss_gb": peak_rss_gb(), **fields}
        gpu = peak_gpu_gb()
        if gpu is not None:
            record["peak_gpu_gb"] = gpu
        with self.lock:
            self.fh.write(json.dumps(record, default=_jsonable) + "\n")
            self.fh.flush()

    def heartbeat(self, every_s: float) -> threading.Event:
        """Emit a heartbeat (with the work count) every `every_s` from a thread of its own
        until the returned event is set."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every_s):
                self.emit("heartbeat", work=self.work())

        threading.Thread(target=beat, daemon=True, name="job-heartbeat").start()
        return stop

    def check(self) -> None:
        if self.cancel.is_set():
            raise Cancelled()


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return float(x) if hasattr(x, "__float__") else str(x)


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def peak_gpu_gb() -> float | None:
    torch = sys.modules.get("torch")
    try:  # torch may be half imported when the heartbeat thread looks
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return float(torch.cuda.max_memory_allocated()) / 1024**3
    except Exception:
        return None


def finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def write_curves(history: list[dict[str, float]], path: Path, title: str) -> str | None:
    """Loss and batch reward per optimiser step as a PNG."""
    if not history:
        return None
    from agentrl.training.plot import plt

    steps = [h.get("step", i + 1) for i, h in enumerate(history)]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    axes[0].plot(steps, [h.get("loss", np.nan) for h in history])
    axes[0].set_title("loss")
    axes[1].plot(steps, [h.get("reward_mean", np.nan) for h in history])
    axes[1].set_title("batch reward")
    for ax in axes:
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return str(path)


def current_metrics(m: dict[str, Any]) -> dict[str, Any]:
    return {
        "loss": finite(m.get("loss")),
        "reward_mean": finite(m.get("reward_mean")),
        "reward_std": finite(m.get("reward_std")),
        "policy_entropy": finite(m.get("policy_entropy")),
        "kl_divergence": finite(m.get("approx_kl", m.get("kl_ref"))),
        "learning_rate": finite(m.get("learning_rate")),
    }


class Progress:
    """Step counting, ETA and periodic progress events."""

    def __init__(self, emitter: Emitter, total_steps: int, epochs: int, every: int) -> None:
        self.emitter = emitter
        self.total = max(1, total_steps)
        self.epochs = epochs
        self.every = every
        self.t0 = time.monotonic()
        self.done_at_start = 0
        self.train_s = 0.0

    def report(
        self,
        step: int,
        epoch: int,
        metrics: dict[str, float],
        best: Any = None,
        force: bool = False,
    ) -> None:
        if not force and step % self.every and step != self.total:
            return
        # job process -> multiprocess metrics (the steps since the last report, the curve)
        since = getattr(self, "_obs_step", self.done_at_start)
        obs.training_step(step - since, metrics.get("reward_mean"), metrics.get("loss"))
        self._obs_step = step
        elapsed = time.monotonic() - self.t0
        new = max(1, step - self.done_at_start)
        eta = elapsed / new * max(0, self.total - step)
        self.emitter.emit(
            "running",
            phase="training",
            progress={
                "current_epoch": epoch,
                "total_epochs": self.epochs,
                "current_step": step,
                "total_steps": self.total,
                "percent_complete": round(min(100.0, 100.0 * step / self.total), 2),
                "eta_seconds": round(eta, 1),
            },
            metrics={"current": current_metrics(metrics), **({"best": best} if best else {})},
            train_s=self.train_s,
        )
