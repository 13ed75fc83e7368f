"""Paired comparison of two saved greedy held-out runs on the same tool-use tasks (issue 52;
the comparison itself: `evaluation.tooluse_paired`):

    python -m agentrl.bench.tooluse_paired runs/x/heldout_before.jsonl runs/x/heldout_v.jsonl
    python -m agentrl.bench.tooluse_paired --pool train loop/heldout/v1.jsonl loop/heldout/v3.jsonl

prints one JSON line (`paired`); the job harness puts `paired(before, after)` in each
variant's record as `paired_vs_before`, and `agentrl loop --env tooluse` writes one file per
version (`<data-dir>/heldout/<version>.jsonl`, both pools: `--pool` picks one).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from agentrl.evaluation.tooluse_paired import paired


def outcomes(path: Path, pool: str | None = None) -> list[SimpleNamespace]:
    """A saved held-out file's tasks and verdicts (`family`, `seed`, `success` of each
    line; the turns are not needed); with `pool`, that pool's lines only. A line that
    ended on an error (the loop's `error`) measured nothing and is left out."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            if d.get("error") or (pool is not None and d.get("pool", "train") != pool):
                continue
            out.append(SimpleNamespace(family=d["family"], seed=d["seed"], success=d["success"]))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reference", type=Path, help="held-out episodes (e.g. heldout_before.jsonl)")
    p.add_argument("other", type=Path, help="held-out episodes of the same tasks")
    p.add_argument("--pool", choices=("train", "unseen"), help="only this pool's tasks")
    a = p.parse_args(argv)
    try:
        out = paired(outcomes(a.reference, a.pool), outcomes(a.other, a.pool))
    except ValueError as e:
        p.error(str(e))
    print(json.dumps({"reference": str(a.reference), "other": str(a.other), **out}))


if __name__ == "__main__":
    main()
