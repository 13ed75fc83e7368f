"""`agentrl learn` (the stand-alone learning run) end to end on a tiny model: table, PNG, adapter with a
verified manifest, and the last line's keys."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.llm.checkpoint import verify_local


def test_learn_ends_with_the_json_line_and_writes_its_outputs(tmp_path: Path) -> None:
    out = tmp_path / "learning"
    result = CliRunner().invoke(
        app,
        [
            "learn",
            "--model",
            "tiny",
            "--iterations",
            "2",
            "--heldout-seeds",
            "3",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(last) == {
        "base_heldout_success",
        "trained_heldout_success",
        "heldout_seeds",
        "wall_s",
    }
    assert last["heldout_seeds"] == 3
    assert (out / "heldout_success.png").stat().st_size > 0
    assert verify_local(out / "adapter")
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["iterations"]) == 2
