"""Garbage-collector settings for a latency-bound server process (the gateway).

Why: the gateway's process holds torch and the rest of the stack (about 220,000 tracked
objects after start-up). A full collection walks all of them (110-160 ms measured at
real-time priority on the 2-core machine, 270 ms under load), and every request that arrives
meanwhile lands in the tail: at 1,000 requests/s one such pause is a hundred requests past
2 ms. `gc.freeze()` after start-up
moves what exists to the permanent generation, never scanned again; a larger youngest
generation makes the short pauses rarer. Reference counting and the collector still free
everything made afterwards.
"""

from __future__ import annotations

import gc

YOUNG = 10_000  # allocations between two young collections (CPython's default: 700)


def settle(young: int = YOUNG) -> None:
    """Call once start-up is done (imports, models loaded): collect, then freeze."""
    gc.collect()
    gc.freeze()
    t0, t1, t2 = gc.get_threshold()
    if t0:  # 0: the collector is off on purpose; leave it so
        gc.set_threshold(max(t0, young), t1, t2)
