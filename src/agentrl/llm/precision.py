"""Which autocast precision pays off on this machine.

bf16 autocast made scoring and training 2.4-3.9x faster on a CPU with native bf16
(AVX512-BF16 / AMX), but a CPU without it (AVX2 only) emulates bf16 matrix products: the
same SmolLM2 projection took 14.1 ms in bf16 against 2.6 ms in fp32 (2026-11-23), and the
shipped learning job ran for hours instead of minutes. `dtype: auto` measures once per
process and picks the faster; behaviour and training still share whichever it picks, so
PPO ratios stay exact.
"""

from __future__ import annotations

import time
from functools import cache
from typing import Literal

import torch

Precision = Literal["fp32", "bf16"]


def _best_of(dtype: torch.dtype, x: torch.Tensor, w: torch.Tensor, runs: int = 3) -> float:
    a, b = x.to(dtype), w.to(dtype)
    torch.nn.functional.linear(a, b)  # warm-up: first-call dispatch and allocation
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        torch.nn.functional.linear(a, b)
        best = min(best, time.perf_counter() - t0)
    return best


@cache
def bf16_pays(device: str = "cpu") -> bool:
    """Whether a bf16 matrix product beats fp32 here (one SmolLM2-sized MLP projection,
    best of three; ~20-60 ms once per process)."""
    if torch.device(device).type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 576, generator=g)
    w = torch.randn(1536, 576, generator=g)
    return _best_of(torch.bfloat16, x, w) < _best_of(torch.float32, x, w)


def resolve_precision(name: str, device: str = "cpu") -> Precision:
    """`auto` -> bf16 where it is faster, else fp32; `fp32` and `bf16` are kept as asked."""
    if name == "auto":
        return "bf16" if bf16_pays(device) else "fp32"
    if name in ("fp32", "bf16"):
        return name  # type: ignore[return-value]
    raise ValueError(f"precision must be auto, fp32 or bf16, got {name!r}")
