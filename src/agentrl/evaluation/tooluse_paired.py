"""Paired comparison of two greedy held-out runs on the same tool-use tasks (issue 52): which
tasks one run solves that the other does not, per family, with a two-sided sign test. Two
single runs' Wilson intervals overlap at these sizes (90 tasks) even where one gains on ten
tasks and loses on three; the pairs say more, and say which family moved. Here, below the
loop (`agentrl loop --env tooluse` pairs its versions) and the job harness
(`bench.tooluse_job`, and `python -m agentrl.bench.tooluse_paired` on saved files)."""

from __future__ import annotations

import math
from collections.abc import Sequence
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
