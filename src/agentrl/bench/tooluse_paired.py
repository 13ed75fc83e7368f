"""Paired comparison of two greedy held-out runs on the same tool-use tasks (issue 52): which
tasks one run solves that the other does not, per family, with a two-sided sign test. Two
single runs' Wilson intervals overlap at these sizes (90 tasks) even where one gains on ten
tasks and loses on three; the pairs say more, and say which family moved.

    python -m agentrl.bench.tooluse_paired runs/x/heldout_before.jsonl runs/x/heldout_v.jsonl

prints one JSON line (`paired`); the job harness puts `paired(before, after)` in each
variant's record as `paired_vs_before`.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def sign_test_p(gained: int, lost: int) -> float:
    """Two-sided exact sign test of `gained` against `lost` (ties dropped): the chance of a
    split at least this uneven if either direction were equally likely."""
    n, k = gained + lost, min(gained, lost)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, j) for j in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(reference: Sequence[Any], other: Sequence[Any]) -> dict[str, Any]:
    """Tasks `other` solves and `reference` does not (`gained`) and the reverse (`lost`),
    in all and per family, and the sign test's p. Both must hold the same tasks (family,
    seed): a comparison of different tasks is not paired (ValueError)."""
    ref = {(e.family, e.seed): bool(e.success) for e in reference}
    new = {(e.family, e.seed): bool(e.success) for e in other}
    if set(ref) != set(new) or len(ref) != len(reference) or len(new) != len(other):
        only = sorted(set(ref) ^ set(new))[:3]
        raise ValueError(
            f"not the same tasks ({len(reference)} against {len(other)}; e.g. {only}): "
            "a paired comparison needs the same held-out set once each"
        )
    gained = [k for k in new if new[k] and not ref[k]]
    lost = [k for k in new if ref[k] and not new[k]]
    families = sorted({k[0] for k in new})

    def per_family(keys: list[tuple[str, int]]) -> dict[str, int]:
        return {f: sum(k[0] == f for k in keys) for f in families}

    return {
        "tasks": len(new),
        "reference_ok": sum(ref.values()),
        "other_ok": sum(new.values()),
        "gained": len(gained),
        "lost": len(lost),
        "gained_by_family": per_family(gained),
        "lost_by_family": per_family(lost),
        "sign_test_p": round(sign_test_p(len(gained), len(lost)), 4),
    }


def outcomes(path: Path) -> list[SimpleNamespace]:
    """A saved held-out file's tasks and verdicts (`family`, `seed`, `success` of each
    line; the turns are not needed)."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out.append(SimpleNamespace(family=d["family"], seed=d["seed"], success=d["success"]))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reference", type=Path, help="held-out episodes (e.g. heldout_before.jsonl)")
    p.add_argument("other", type=Path, help="held-out episodes of the same tasks")
    a = p.parse_args(argv)
    try:
        out = paired(outcomes(a.reference), outcomes(a.other))
    except ValueError as e:
        p.error(str(e))
    print(json.dumps({"reference": str(a.reference), "other": str(a.other), **out}))


if __name__ == "__main__":
    main()
