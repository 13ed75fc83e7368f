"""`agentrl bench learning --settings tooluse --seeds N`: the tool-use learning run
(`agentrl.learners.tooluse`) repeated over training seeds: base, warm-start and trained
held-out success per seed and per family, pooled with 95 % Wilson intervals (every seed
plays the same held-out tasks, so the pooled interval is over seeds x tasks); the
unseen-phrasing pool pooled apart."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.core.stats import wilson
from agentrl.learners.tooluse import ToolUseConfig, run_tooluse

STAGES = ("base", "start", "trained")


def bench_tooluse(
    config_path: Path,
    seeds: int,
    out: Path,
    say: Callable[[str], None] = print,
    **overrides: Any,
) -> dict[str, Any]:
    """Run the config once per seed; returns the pooled record (also written to OUT)."""
    t0 = time.perf_counter()
    records = []
    for seed in range(seeds):
        cfg = ToolUseConfig.from_file(
            config_path, seed=seed, out_dir=str(out / f"seed-{seed}"), **overrides
        )
        _, rec = run_tooluse(cfg, say=say)
        records.append(rec)
        say(json.dumps({"seed": seed, **rec}))
    pooled: dict[str, Any] = {"seeds": seeds}
    families = ToolUseConfig.from_file(config_path).families
    n = records[0]["heldout_tasks"] if records else 0
    for stage in STAGES:
        vals = [r[f"{stage}_heldout_success"] for r in records]
        if any(v is None for v in vals) or not vals:
            pooled[f"{stage}_success"] = None
            continue
        wins = round(sum(v * n for v in vals))
        pooled[f"{stage}_success"] = wins / (n * len(vals))
        pooled[f"{stage}_ci"] = [round(x, 3) for x in wilson(wins, n * len(vals))]
        pooled[f"{stage}_per_seed"] = vals
        for f in families:
            fam = [r[f"{stage}_{f}"] for r in records]
            pooled[f"{stage}_{f}"] = sum(fam) / len(fam)
        unseen = [r.get(f"unseen_{stage}_success") for r in records]
        m = int(records[0].get("unseen_tasks") or 0)
        got = [float(v) for v in unseen if v is not None]
        if m and len(got) == len(unseen):  # the unseen-phrasing pool, apart
            uw = round(sum(v * m for v in got))
            pooled[f"unseen_{stage}_success"] = uw / (m * len(unseen))
            pooled[f"unseen_{stage}_ci"] = [round(x, 3) for x in wilson(uw, m * len(unseen))]
    pooled.update(
        heldout_tasks=n,
        warm_start_s=[r["warm_start_s"] for r in records],
        rl_s=[r["rl_s"] for r in records],
        eval_s=[r["eval_s"] for r in records],
        wall_s=round(time.perf_counter() - t0, 1),
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tooluse_bench.json").write_text(json.dumps({"pooled": pooled, "runs": records}))
    return pooled
