"""`agentrl bench metrics`: what instrumentation costs, measured directly and load-robustly.

The end-to-end benches (`bench rewards`, `bench bus`) compare throughput with metrics on and
off, which on a shared 2-core machine moves by more than the effect. This bench times the
hooks themselves on realistic batches (CPU time per message, best of several repeats) so the
overhead fraction can be computed against the service's own CPU cost per message.
"""

from __future__ import annotations

import random
import time
from typing import Any

from agentrl.bench.options import MetricsBench
from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.observability import instrument
from agentrl.observability import metrics as m


def _best_cpu_per_item(fn: Any, items: int, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best / items * 1e6


def run_metrics_benchmark(batch: int = 256, batches: int = 40) -> dict[str, Any]:
    rng = random.Random(0)
    events = [TrajectoryEvent.model_validate(sample_trajectory(i, rng=rng)) for i in range(batch)]
    rewards = [
        {
            "trajectory_id": e.trajectory_id,
            "total_reward": rng.random(),
            "reward_components": {
                name: {"score": rng.random(), "weight": 0.25}
                for name in ("task_completion", "efficiency", "code_quality", "user_feedback")
            },
        }
        for e in events
    ]

    def rewards_hook() -> None:
        for _ in range(batches):
            instrument.reward_batch(events, rewards, 0.01)

    def bus_hooks() -> None:
        for _ in range(batches):
            instrument.bus_published("agent.rl.trajectory.v1", batch)
            instrument.bus_consumed("rewards", batch)

    def gateway_hook() -> None:
        for i in range(batches * 10):
            instrument.gateway_request("v1" if i % 3 else "v2", 0.05, error=i % 50 == 0)

    reward_us = _best_cpu_per_item(rewards_hook, batch * batches)
    bus_us = _best_cpu_per_item(bus_hooks, batch * batches)
    gateway_us = _best_cpu_per_item(gateway_hook, batches * 10)
    t0 = time.perf_counter()
    for _ in range(20):
        text = m.exposition()
    scrape_ms = (time.perf_counter() - t0) / 20 * 1000
    return {
        "reward_hook_us_per_trajectory": round(reward_us, 3),
        "bus_hook_us_per_message": round(bus_us, 4),
        "gateway_hook_us_per_request": round(gateway_us, 3),
        "scrape_ms": round(scrape_ms, 2),
        "scrape_bytes": len(text),
    }


def command(cfg: MetricsBench) -> None:
    """`agentrl bench metrics`: the table and the JSON line."""
    from agentrl.bench.report import report

    res = run_metrics_benchmark(batch=cfg.batch)
    rows = [{"hook": k, "value": v} for k, v in res.items()]
    report("metrics hooks (CPU time, best of 7)", rows, res)
