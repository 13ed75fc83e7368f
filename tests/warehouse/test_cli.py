"""The CLI as a user runs it (a child process: it opens its own chdb data path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def agentrl(args: list[str], env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *args],
        env=env,
        capture_output=True,
        timeout=120,
        check=True,
    )
    return out.stdout.decode()


def test_stats_and_export(tmp_path: Path) -> None:
    env = {**os.environ, "AGENTRL_DATA_DIR": str(tmp_path), "COLUMNS": "200"}
    counts = json.loads(agentrl(["stats", "counts", "--json"], env))
    assert counts["trajectories"] == 0 and set(counts) >= {"rewards", "turns", "model_versions"}
    out = agentrl(["warehouse", "export", str(tmp_path / "d.jsonl"), "--min-reward", "0.5"], env)
    assert "wrote 0 trajectories" in out and (tmp_path / "d.jsonl").exists()
    assert (tmp_path / "warehouse").is_dir()  # chdb keeps its data in the data dir
