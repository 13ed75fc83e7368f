"""vLLM's LoRA limits sized from the adapters it serves (issue 53: one base, many lineages).

`--max-loras` is how many distinct adapters one batch may hold: a request of an adapter past
it waits for a batch with a free slot, so it is sized from the adapters live at once (every
lineage's live version and canary), not fixed. `--max-cpu-loras` is vLLM's cache of
adapters kept in host memory (beyond it an adapter is read from disk again when a request
needs it). `--max-lora-rank` must be one vLLM accepts and at least every adapter's rank, or
the load is refused. Growth is by powers of two, so a stack adding lineages one by one
restarts vLLM rarely; operators' settings are floors and `max_loras_cap` the ceiling.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agentrl.serving.errors import DeployError

# the ranks `vllm serve --max-lora-rank` accepts (vllm/config/lora.py, 0.11 and later)
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoraLimits:
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int

    def args(self) -> list[str]:
        return [
            "--max-loras", str(self.max_loras),
            "--max-lora-rank", str(self.max_lora_rank),
            "--max-cpu-loras", str(self.max_cpu_loras),
        ]  # fmt: skip

    def fits(self, adapters: int, rank: int) -> bool:
        return adapters <= self.max_loras and rank <= self.max_lora_rank


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def lora_limits(
    adapters: int, rank: int, *, floor_loras: int = 4, floor_rank: int = 16, cap: int = 64
) -> LoraLimits:
    """Limits for `adapters` live adapters of rank up to `rank`. DeployError when the rank is
    above what vLLM accepts or the adapters exceed `cap` (a batch slot each costs memory)."""
    want = max(floor_loras, adapters, 1)
    if want > cap:
        raise DeployError(
            f"{adapters} live adapters exceed AGENTRL_VLLM_MAX_LORAS_CAP={cap} (adapters in "
            "one vLLM batch); raise it or retire lineages"
        )
    loras = min(cap, _pow2(want))
    need = max(rank, floor_rank)
    fitting = [r for r in VLLM_RANKS if r >= need]
    if not fitting:
        raise DeployError(f"LoRA rank {rank} is above vLLM's largest ({VLLM_RANKS[-1]})")
    return LoraLimits(loras, fitting[0], max(loras, 2 * loras))


def adapter_rank(folder: Path) -> int:
    """The largest rank of the peft adapter in `folder` (rank_pattern included)."""
    try:
        cfg = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise DeployError(f"{folder}: unreadable adapter_config.json: {exc}") from exc
    ranks = [int(cfg.get("r") or 0), *(int(v) for v in (cfg.get("rank_pattern") or {}).values())]
    return max(ranks)
