"""`agentrl bench play` on the tiny random model: both sides play the same held-out tasks,
greedy, and sample the same tokens; the cached side prefills less and says where its prompt
tokens came from; the command prints its table and the JSON line last.

In this process through the command's own app (typer's runner), not a new Python: the
benchmark's work is ~1.6 CPU-s, a fresh process's imports of torch and transformers ~9
(2026-11-30, load 5)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agentrl.cli import app


def test_the_cached_play_prefills_less_samples_the_same_tokens_and_prints_json_last() -> None:
    args = ["bench", "play", "--model", "tiny",
            "--tasks-per-family", "1", "--max-new-tokens", "24", "--max-steps", "3"]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output[-2000:]
    assert "CPU speed-up" in done.stdout
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["episodes"] == 3 and out["same_tokens"] is True
    assert out["turns_cache"] == out["turns_no_cache"] >= 3
    assert out["cached_tokens_no_cache"] == 0 and out["cached_tokens_cache"] > 0
    assert out["prefill_tokens_cache"] < out["prefill_tokens_no_cache"]
    assert out["cpu_s_per_episode_cache"] > 0 and out["cpu_speedup"] > 0
