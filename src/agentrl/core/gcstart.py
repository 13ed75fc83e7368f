"""The garbage collector's young generation, set once at an agentrl process's entry point.

Why: a process that imports torch, transformers and peft (a loop, `agentrl up`, a launcher,
a job) builds ~400,000 long-lived objects, and its imports leave many cycles. With CPython's
default young generation (a collection every 700 allocations, a middle one every ten, a full
one every ten middle ones) six full collections walked the growing heap during those imports
alone: 0.9 CPU-s of collection, 0.58 of it full. With 10,000 (the gateway's value after its
start-up, `serving.gctune`) no full collection runs during them: the imports took 7.9
instead of 8.4 CPU-s (three runs each, load 5.5-6). Reference counting frees what has no
cycle as before; a cycle waits at most 10,000 allocations longer.
"""

from __future__ import annotations

import gc

YOUNG = 10_000  # allocations between two young collections (CPython's default: 700)


def raise_young_generation(young: int = YOUNG) -> None:
    """Collect the young generation every `young` allocations, if it is collected more
    often now; a collector turned off (threshold 0) stays off."""
    t0, t1, t2 = gc.get_threshold()
    if t0 and t0 < young:
        gc.set_threshold(young, t1, t2)
