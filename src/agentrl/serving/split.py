"""Sticky weighted traffic split: a session key hashes to a point in [0, 1); the versions
own consecutive slices of that interval in a fixed order (newest first), so a session stays
on its version while the weights stay, and a growing canary only takes sessions over from
the live version (never shuffles the rest). Pure functions: the gateway and the benchmark
use the same code.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence


def session_point(key: str, salt: str = "") -> float:
    """A uniform point in [0, 1) for `key` (blake2b, stable across processes and runs)."""
    digest = hashlib.blake2b(f"{salt}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def choose(
    weights: Mapping[str, float],
    order: Sequence[str],
    key: str | None,
    salt: str = "",
    rng: random.Random | None = None,
) -> str:
    """The version serving session `key` (random when there is no key).

    `weights` are percentages (any positive scale); `order` fixes the slices' order;
    versions with weight 0 never serve. Raises ValueError when no version has weight.
    """
    live = [(v, float(weights.get(v, 0.0))) for v in order if weights.get(v, 0.0) > 0]
    total = sum(w for _, w in live)
    if total <= 0:
        raise ValueError("no version has traffic weight")
    point = session_point(key, salt) if key else (rng or random).random()
    edge = 0.0
    for version, w in live:
        edge += w / total
        if point < edge:
            return version
    return live[-1][0]
