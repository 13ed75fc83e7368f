"""`agentrl bench choice` scores the loop's own prompts (its system prompt and distinct
egocentric observations) through each peer: the path before batching, one at a time, and
8 or 32 in flight; its last line is the JSON of the figures.

The command runs in this process through its own app (typer's runner), not a new Python:
its work is ~1.4 CPU-s, a fresh process's imports of torch and transformers ~9 (2026-11-30,
load 5)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agentrl.bench.choice import loop_prompts
from agentrl.cli import app


def test_the_prompts_are_the_loops_own_and_distinct() -> None:
    from agentrl.app.loop import _system_prompt

    chats = loop_prompts(40)
    assert len(chats) == 40
    assert all(c[0] == {"role": "system", "content": _system_prompt()} for c in chats)
    assert len({c[1]["content"] for c in chats}) == 40


def test_bench_choice_prints_each_peer_and_json_last() -> None:
    done = CliRunner().invoke(app, ["bench", "choice", "--model", "tiny", "--prompts", "6"])
    assert done.exit_code == 0, done.output[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    for peer in ("before", "one_by_one", "batched_8", "batched_32"):
        assert last[f"{peer}_prompts_per_s"] > 0, peer
    assert last["prompts"] == 6 and last["prompt_tokens_mean"] > 50 and last["speedup"] > 0
