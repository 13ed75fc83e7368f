"""`dtype: auto` picks the precision this machine computes faster, and only a known one."""

from __future__ import annotations

import time

import pytest
import torch

from agentrl.learners.valid_action import ValidActionConfig
from agentrl.llm.precision import bf16_pays, resolve_precision


def _linear_s(dtype: torch.dtype) -> float:
    x, w = torch.randn(64, 576).to(dtype), torch.randn(1536, 576).to(dtype)
    torch.nn.functional.linear(x, w)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - t0)
    return best


def test_auto_follows_the_measurement() -> None:
    assert resolve_precision("auto") == ("bf16" if bf16_pays() else "fp32")
    assert ValidActionConfig(dtype="auto").dtype == resolve_precision("auto")


def test_auto_never_picks_a_much_slower_bf16() -> None:
    # where bf16 is emulated (AVX2-only CPUs: ~5x slower), auto must not choose it
    if _linear_s(torch.bfloat16) > 2 * _linear_s(torch.float32):
        assert resolve_precision("auto") == "fp32"
    else:
        pytest.skip("bf16 is not much slower than fp32 on this machine")


def test_explicit_precisions_are_kept_and_unknown_ones_refused() -> None:
    assert resolve_precision("fp32") == "fp32"
    assert resolve_precision("bf16") == "bf16"
    assert ValidActionConfig(dtype="bf16").dtype == "bf16"
    with pytest.raises(ValueError, match="auto, fp32 or bf16"):
        resolve_precision("fp16")


def test_shipped_config_resolves_to_a_concrete_precision() -> None:
    config = ValidActionConfig.from_file("configs/frozenlake-valid-action.yaml")
    assert config.dtype in ("fp32", "bf16")


AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma bmi2\n"
WITH_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile\n"


def test_native_bf16_is_read_from_the_cpu_flags() -> None:
    from agentrl.llm.precision import native_bf16

    assert native_bf16(AVX2_ONLY) is False
    assert native_bf16(WITH_BF16) is True
    assert native_bf16("processor\t: 0\n") is None  # nothing to read: the timing decides


def test_a_cpu_without_native_bf16_never_gets_bf16_even_when_the_timing_is_fooled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A busy host once made fp32 look slower on an AVX2-only CPU (every training step then
    ran 9x slower in emulated bf16): without the flag the timing is not consulted."""
    from agentrl.llm import precision

    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    monkeypatch.setattr(
        precision, "_best_of", lambda dtype, *a, **k: 1.0 if dtype == torch.float32 else 0.1
    )
    precision.bf16_pays.cache_clear()
    try:
        assert precision.bf16_pays() is False
    finally:
        precision.bf16_pays.cache_clear()
