"""Which autocast precision pays off on this machine.

bf16 autocast made scoring and training 2.4-3.9x faster on a CPU with native bf16
(AVX512-BF16 / AMX), but a CPU without it (AVX2 only) emulates bf16 matrix products: the
same SmolLM2 projection took 14.1 ms in bf16 against 2.6 ms in fp32 (2026-11-23), and the
shipped learning job ran for hours instead of minutes. `dtype: auto` picks bf16 only on a
CPU that says it computes bf16 natively (Linux: the `avx512_bf16` or `amx_bf16` flag) and
where a bf16 product then also measures clearly faster; the timing alone is not enough: a
busy host once made fp32 look slower on an AVX2-only CPU, and every training step of the main
job ran 9x slower in emulated bf16 (2026-11-27). Behaviour and training share whichever it
picks, so PPO ratios stay exact.
"""

from __future__ import annotations

import platform
import time
from functools import cache
from pathlib import Path
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
    """Whether bf16 pays here: a CPU with native bf16 whose bf16 product (one SmolLM2-sized
    MLP projection, best of five) also takes under 0.8x the fp32 time; ~30-90 ms once."""
    if torch.device(device).type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if native_bf16() is False:
        return False
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 576, generator=g)
    w = torch.randn(1536, 576, generator=g)
    return _best_of(torch.bfloat16, x, w, runs=5) < 0.8 * _best_of(torch.float32, x, w, runs=5)


def native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this x86 CPU computes bf16 natively (AVX512-BF16 or AMX); None where that
    cannot be read (another OS or architecture: the timing decides there)."""
    if cpuinfo is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return None
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return None
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split(":", 1)[-1].split()))


def resolve_precision(name: str, device: str = "cpu") -> Precision:
    """`auto` -> bf16 where it is faster, else fp32; `fp32` and `bf16` are kept as asked."""
    if name == "auto":
        return "bf16" if bf16_pays(device) else "fp32"
    if name in ("fp32", "bf16"):
        return name  # type: ignore[return-value]
    raise ValueError(f"precision must be auto, fp32 or bf16, got {name!r}")
