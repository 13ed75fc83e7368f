"""matplotlib's pyplot on the Agg backend, for a job's curves (`progress.write_curves`).

A module of its own so that the job launcher imports it once with torch
(`launcher.PRELOAD`): a job forked from the launcher otherwise spent ~0.8 CPU-s importing
pyplot for its one PNG.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # (after the backend is chosen)

__all__ = ["plt"]
