"""`agentrl bench serving`'s prefix part (`agentrl.bench.prefix`) on a tiny random
model: the synthetic Agent Zero prompt has exactly the tokens asked for, and the run reports
every figure, with the second request's prefill a small share of the first's in tokens."""

from __future__ import annotations

from typing import Any

from agentrl.bench.prefix import prefix_run, synthetic_prompt


def test_the_synthetic_prompt_has_the_tokens_asked_for(engine: Any) -> None:
    text = synthetic_prompt(engine.tokenizer, 700)
    assert len(engine.tokenizer(text, add_special_tokens=False)["input_ids"]) == 700
    assert "code_execution_tool" in text and '"tool_args"' in text


async def test_prefix_run_reports_every_figure() -> None:
    out = await prefix_run("tiny", tokens=900, max_tokens=2)
    assert out["agent_zero_prompt"] == "synthetic" and out["agent_zero_prompt_tokens"] == 900
    for key in (
        "prefix_hit_prefill_fraction",
        "agent_zero_two_turns_s_before",
        "agent_zero_two_turns_s_after",
        "prefix_first_prefill_s",
    ):
        assert out[key] > 0, key
    assert out["prefix_cache_mb"] > 0
    assert len(out["agent_zero_turn_s_before"]) == len(out["agent_zero_turn_s_after"]) == 2
