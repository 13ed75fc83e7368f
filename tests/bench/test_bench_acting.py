"""`agentrl bench acting` on the tiny random model: the loop's agents act through the gateway
and the local engine for a few seconds, and the figures add up (episodes counted, every
share of wall between 0 and 1, forward passes within the engine's busy time)."""

from __future__ import annotations

from agentrl.bench.acting import run_acting
from agentrl.bench.options import ActingBench


async def test_a_short_window_of_acting_gives_consistent_figures() -> None:
    # short episodes (two turns of 16 tokens): at the loop's 4 x 256 the tiny random model's
    # episode is ~190-600 tokens, and a 3 s window at load 8 ended none (the suite's run of
    # 2026-11-30 failed here; 0 episodes beside 4 CPU hogs, 20 with these); and the window
    # stays open until one ended, however busy the host
    bench = ActingBench(
        model="tiny", seconds=3.0, agents=2, max_tokens=16, max_steps=2, min_episodes=1
    )
    out = await run_acting(bench)
    assert out["episodes"] > 0 and out["episodes_per_min"] > 0
    assert out["gen_tokens"] > 0 and out["decode_steps"] > 0
    shares = [k for k in out if k.startswith("share_")]
    assert {"share_forward", "share_mask", "share_tools", "share_other"} <= set(shares)
    assert all(0.0 <= out[k] <= 1.0 for k in shares), {k: out[k] for k in shares}
    assert out["share_forward"] <= out["engine_busy_share"] + 1e-9
    assert out["engine_cpu_ms_per_token"] > 0 and out["torch_threads"] >= 1
    assert 0.0 <= out["prefix_cache_hit_share"] <= 1.0
