"""`agentrl bench serving`'s multi-LoRA part on a tiny random base: every key of the JSON
line, measured through the engine and through the real gateway (uvicorn, HTTP)."""

from __future__ import annotations

from agentrl.bench.multilora import multilora_run
from deploy_helpers import TINY


async def test_multilora_bench_reports_tokens_per_s_per_n_and_adapter_memory() -> None:
    out = await multilora_run(
        "tiny", batch=4, max_tokens=4, rounds=1, levels=(1, 2), tiny_kwargs=TINY
    )
    for key in ("base", "1", "2"):
        assert out[f"multilora_tokens_per_s_{key}"] > 0
    assert out["multilora_gateway_tokens_per_s_2"] > 0
    # TINY's two layers, r=16 on q, k, v, o of width 32: 2 x 4 x (16x32 + 32x16) floats
    assert out["adapter_param_mib"] == round(2 * 4 * 1024 * 4 / 2**20, 2)
    assert isinstance(out["adapter_mib"], float)
    assert out["multilora_batch_sizes"][-1] <= 4
