"""`agentrl bench choice` scores the loop's own prompts (its system prompt and distinct
egocentric observations) through each peer: the path before batching, one at a time, and
8 or 32 in flight; its last line is the JSON of the figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentrl.bench.choice import loop_prompts


def test_the_prompts_are_the_loops_own_and_distinct() -> None:
    from agentrl.app.loop import _system_prompt

    chats = loop_prompts(40)
    assert len(chats) == 40
    assert all(c[0] == {"role": "system", "content": _system_prompt()} for c in chats)
    assert len({c[1]["content"] for c in chats}) == 40


def test_bench_choice_prints_each_peer_and_json_last() -> None:
    agentrl = str(Path(sys.executable).parent / "agentrl")
    proc = subprocess.run(
        [agentrl, "bench", "choice", "--model", "tiny", "--prompts", "6"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    for peer in ("before", "one_by_one", "batched_8", "batched_32"):
        assert last[f"{peer}_prompts_per_s"] > 0, peer
    assert last["prompts"] == 6 and last["prompt_tokens_mean"] > 50 and last["speedup"] > 0
