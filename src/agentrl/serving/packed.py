"""The local engine's Linear layers on weights packed once for MKL's GEMM.

Why: a decode step multiplies a few rows (the batch) by every weight matrix, and MKL's
plain sgemm repacks the whole weight matrix on every call: in a py-spy profile of the
tool-use agents' decoding (SmolLM2-135M, 16 rows, one thread) the packing copy alone
(`mkl_blas_avx512_sgemm_scopy_right48`) was 27 % of the decode thread, as much as the
multiplications. `torch.ops.mkl._mkl_linear` over a weight packed once
(`_mkl_reorder_linear_weight`, what torch's inductor uses on CPU) skips it: the MLP
projections ran ~2x faster at 16 rows.

Exactness: the packed GEMM runs the same kernels in the same order, so its results are
bit-identical to `F.linear` on this build (checked per weight shape when packing, at batch
sizes 1-64 and prefill sizes; a shape that differs is left unpacked), and the engine's
tokens and log-probs do not change. fp32 on CPU only (bf16 and other devices keep
`F.linear`). The packed copy costs about the weights' size in memory again.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch

log = logging.getLogger(__name__)

PACK_HINT = 16  # the batch size MKL packs for (packed for 1 it chose a kernel that differs)
PROBE_ROWS = (1, 2, 3, 7, 16, 17, 32, 64, 97)  # batch sizes and a prefill length checked
PROBE_ROWS_WIDE = (1, 2, 16, 33)  # for the vocabulary projection (tens of thousands of rows)


def available() -> bool:
    """Whether this torch build has MKL's packed linear ops."""
    if not torch.backends.mkl.is_available():
        return False
    try:
        torch.ops.mkl._mkl_reorder_linear_weight  # noqa: B018
        torch.ops.mkl._mkl_linear  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


def _exact(weight: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """The packed product equals `F.linear` bit for bit on probe inputs of this shape."""
    g = torch.Generator().manual_seed(0)
    rows = PROBE_ROWS_WIDE if weight.shape[0] > 8192 else PROBE_ROWS
    scale = float(weight.abs().mean()) or 1.0
    for m in rows:
        x = torch.randn(m, weight.shape[1], generator=g) / scale**0.5
        ref = torch.nn.functional.linear(x, weight, bias)
        got = torch.ops.mkl._mkl_linear(x, packed, weight, bias, PACK_HINT)
        if not torch.equal(ref, got):
            return False
    return True


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float32 or x.requires_grad or torch.is_grad_enabled():
        return torch.nn.functional.linear(x, self.weight, self.bias)
    shape = x.shape
    out = torch.ops.mkl._mkl_linear(
        x.reshape(-1, shape[-1]), self._agentrl_packed, self.weight, self.bias, PACK_HINT
    )
    return out.reshape(*shape[:-1], out.shape[-1])


@torch.no_grad()
def pack_linears(model: torch.nn.Module) -> int:
    """Give every fp32 CPU `nn.Linear` of `model` a packed copy of its weight and a forward
    that uses it under `no_grad` (with gradients on, `F.linear` as before). Forward hooks
    (the multi-LoRA deltas) still run. Returns how many layers were packed."""
    if not available():
        return 0
    packed_n = 0
    verdict: dict[tuple[int, int, bool], bool] = {}
    for module in model.modules():
        if type(module) is not torch.nn.Linear:
            continue
        w = module.weight
        if w.dtype != torch.float32 or w.device.type != "cpu":
            continue
        packed = torch.ops.mkl._mkl_reorder_linear_weight(w.detach(), PACK_HINT)
        key = (int(w.shape[0]), int(w.shape[1]), module.bias is not None)
        if key not in verdict:
            verdict[key] = _exact(w.detach(), packed, module.bias)
            if not verdict[key]:
                log.info("packed GEMM differs from F.linear for %s: left unpacked", key)
        if not verdict[key]:
            continue
        module._agentrl_packed = packed  # type: ignore[assignment]
        module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
        packed_n += 1
    return packed_n


def unpack_linears(model: torch.nn.Module) -> None:
    """Undo `pack_linears` (the plain `F.linear` forward, the packed copies freed)."""
    for module in model.modules():
        if hasattr(module, "_agentrl_packed"):
            del module._agentrl_packed
            del module.forward


def is_packed(module: Any) -> bool:
    return hasattr(module, "_agentrl_packed")
