"""`agentrl bench redaction`: precision and recall on the labelled corpus, and what redacting
at the edge costs a producer per trajectory.

Each corpus string goes through the path the service and producers use (JSON-encoded, the
escape-aware pre-scan, then the walk). A positive counts as found when its secret is gone
and a placeholder of its kind is in the output; a negative counts as a false positive when
anything in it changed. precision = found / (found + false positives + positives redacted
under another kind only), recall = found / positives.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections import Counter
from typing import Any

from agentrl.rewards.options import RedactionBench
from agentrl.rewards.pii_corpus import CORPUS
from agentrl.rewards.redact import KINDS, RedactionReport, Redactor, redact_event


def score_corpus(redactor: Redactor | None = None) -> dict[str, Any]:
    """Precision, recall and the per-kind table on `CORPUS`."""
    r = redactor or Redactor()
    per_kind: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
    tp = fp = fn = wrong_kind = 0
    misses: list[str] = []
    false_alarms: list[str] = []
    for text, kind, secret in CORPUS:
        raw = json.dumps({"s": text}).encode()
        out = r.redact(json.loads(raw), RedactionReport(), kinds=r.candidates_json(raw))["s"]
        if kind is None:
            if out != text:
                fp += 1
                false_alarms.append(out)
            continue
        per_kind[kind]["positives"] += 1
        assert secret is not None
        if secret in out:
            fn += 1
            misses.append(text)
        elif f"[REDACTED:{kind.upper()}]" in out:
            tp += 1
            per_kind[kind]["found"] += 1
        else:
            wrong_kind += 1
    negatives = sum(1 for _, kind, _ in CORPUS if kind is None)
    return {
        "strings": len(CORPUS),
        "positives": tp + fn + wrong_kind,
        "negatives": negatives,
        "true_positives": tp,
        "false_positives": fp,
        "false_negatives": fn,
        "wrong_kind": wrong_kind,
        "precision": tp / max(tp + fp + wrong_kind, 1),
        "recall": tp / max(tp + fn + wrong_kind, 1),
        "per_kind": {
            k: {"positives": c["positives"], "recall": c["found"] / c["positives"]}
            for k, c in per_kind.items()
            if c["positives"]
        },
        "misses": misses,
        "false_alarms": false_alarms,
    }


def edge_cost(n: int = 2000, repeats: int = 3, seed: int = 7) -> dict[str, float]:
    """Microseconds `redact_event` costs per trajectory (sample trajectories, 10 % with PII):
    the mean per pass (median of `repeats` passes), the median over every call, and the
    clean and PII-bearing cases apart (medians)."""
    from agentrl.contracts.samples import sample_trajectory
    from agentrl.contracts.trajectory import TrajectoryEvent

    rng = random.Random(seed)
    events = [
        TrajectoryEvent.model_validate(
            sample_trajectory(i, rng=rng, code=i % 2 == 1, pii=i % 10 == 3)
        )
        for i in range(n)
    ]
    r = Redactor()
    per_pass: list[float] = []
    clean: list[float] = []
    dirty: list[float] = []
    for _ in range(repeats):
        t_all = time.perf_counter()
        for ev in events:
            t0 = time.perf_counter()
            _, counts = redact_event(ev, r)
            (dirty if counts else clean).append(time.perf_counter() - t0)
        per_pass.append((time.perf_counter() - t_all) / n)
    every = clean + dirty
    return {
        "us_per_trajectory": statistics.median(per_pass) * 1e6,
        "us_per_trajectory_median": statistics.median(every) * 1e6,
        "us_per_trajectory_spread": (max(per_pass) - min(per_pass)) * 1e6,
        "us_clean_median": statistics.median(clean) * 1e6 if clean else float("nan"),
        "us_with_pii_median": statistics.median(dirty) * 1e6 if dirty else float("nan"),
        "trajectories": float(n),
    }


def command(cfg: RedactionBench) -> None:
    """`agentrl bench redaction`: the per-kind table, misses and false alarms on stderr, the
    JSON line."""
    from agentrl.bench.report import report

    scores = score_corpus()
    cost = edge_cost(cfg.n)
    rows: list[dict[str, Any]] = [
        {"kind": kind, "positives": v["positives"], "recall": round(v["recall"], 3)}
        for kind, v in scores["per_kind"].items()
    ]
    rows.append(
        {
            "kind": "all",
            "positives": scores["positives"],
            "recall": round(scores["recall"], 3),
            "precision": round(scores["precision"], 3),
            "false_positives": scores["false_positives"],
        }
    )
    for miss in scores["misses"]:
        print(f"missed: {miss!r}", file=sys.stderr)
    for alarm in scores["false_alarms"]:
        print(f"false alarm: {alarm!r}", file=sys.stderr)
    figures = {
        "precision": round(scores["precision"], 4),
        "recall": round(scores["recall"], 4),
        "corpus_strings": scores["strings"],
        "false_positives": scores["false_positives"],
        "false_negatives": scores["false_negatives"],
        "edge_redaction_us_per_trajectory": round(cost["us_per_trajectory"], 1),
        "edge_redaction_us_median": round(cost["us_per_trajectory_median"], 1),
        "edge_redaction_us_clean": round(cost["us_clean_median"], 1),
        "edge_redaction_us_with_pii": round(cost["us_with_pii_median"], 1),
    }
    report("redaction", rows, figures)
