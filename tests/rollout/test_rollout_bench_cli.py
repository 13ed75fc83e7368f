"""`agentrl bench rollout` runs end to end (tiny settings) and ends with its JSON line.

In this process through the command's own app (typer's runner), not a new Python: the
benchmark's work is ~2 CPU-s, a fresh process's imports of torch and transformers ~9
(2026-11-30, load 5)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agentrl.cli import app


def test_bench_rollout_prints_json_last() -> None:
    args = ["bench", "rollout", "--group", "3", "--steps", "2", "--max-new-tokens", "3"]
    done = CliRunner().invoke(app, [*args, "--repeats", "1", "--history-window", "1"])
    assert done.exit_code == 0, done.output[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["group"] == 3 and figures["max_new_tokens"] == 3
    for key in ("env_steps_per_s_batched", "env_steps_per_s_one_at_a_time", "batched_speedup"):
        assert figures[key] > 0
    assert "one_at_a_time" in done.stdout
