"""Multiprocess metrics for `agentrl up`, importable without prometheus_client.

Training jobs run in child processes; for their metrics to reach the one `/metrics`
endpoint, every process must write samples to a shared directory (prometheus_client's
multiprocess mode). `agentrl up` calls `enable_for_stack(data_dir)` first thing (when the
metrics module is already imported, its storage is moved onto the files); children inherit
the environment variable and write there too.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ENV_MULTIPROC = "PROMETHEUS_MULTIPROC_DIR"
ENV_AGENTRL_MULTIPROC = "AGENTRL_METRICS_MULTIPROC_DIR"


def enable_multiprocess(directory: Path | str, clean: bool = True) -> Path:
    """Switch this process (and the children it starts) to multiprocess metrics in
    `directory`; `clean` empties it (stale files of dead processes would be summed)."""
    path = Path(directory)
    if clean and path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[ENV_MULTIPROC] = str(path)
    os.environ[ENV_AGENTRL_MULTIPROC] = str(path)
    metrics = sys.modules.get("agentrl.observability.metrics")
    if metrics is not None:  # imported already (`import agentrl` does): move its storage
        metrics.switch_to_multiprocess()
    return path


def enable_for_stack(data_dir: Path | str | None) -> Path:
    """`<data_dir>/metrics/multiproc`, cleaned, unless the user chose a directory already."""
    chosen = os.environ.get(ENV_AGENTRL_MULTIPROC) or os.environ.get(ENV_MULTIPROC)
    if chosen:
        return enable_multiprocess(chosen, clean=True)
    if data_dir is None:
        from agentrl.core.settings import get_settings

        data_dir = get_settings().data_dir
    return enable_multiprocess(Path(data_dir) / "metrics" / "multiproc")
