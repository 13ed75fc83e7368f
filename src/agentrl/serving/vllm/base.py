"""The base model as a folder vLLM can load: the converted SmolLM2 (no download), a seeded
tiny random model saved once, or whatever path / Hugging Face id the user named."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from agentrl.serving.errors import DeployError

# vLLM's CPU attention kernels (CPUAttentionBackend.get_supported_head_sizes)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# a tiny random model vLLM's CPU kernels accept (head size 32); tests and benchmarks use it
VLLM_TINY = {"hidden_size": 128, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 256}


def base_spec(
    name: str, seed: int = 0, tiny_kwargs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"name": name, "seed": int(seed), "tiny_kwargs": tiny_kwargs}


def base_folder(spec: dict[str, Any], data_dir: Path) -> str:
    """A path (or hub id) for `vllm serve --model`, materialising bundled models once."""
    from agentrl.llm.names import SMOLLM2_ALIASES, TINY_ALIASES, atomic_save

    name = str(spec.get("name") or "smollm2")
    key = name.lower()
    if key in SMOLLM2_ALIASES:
        from agentrl.llm.loading import convert_smollm2

        return str(convert_smollm2(data_dir).resolve())
    if key not in TINY_ALIASES:
        return name  # a folder or a hub id: vLLM loads it itself
    kwargs = dict(spec.get("tiny_kwargs") or {})
    seed = int(spec.get("seed") or 0)
    hidden, heads = int(kwargs.get("hidden_size", 64)), int(kwargs.get("num_heads", 4))
    if hidden // heads not in CPU_HEAD_SIZES:
        raise DeployError(
            f"tiny model with head size {hidden // heads}: vLLM's CPU attention supports "
            f"{list(CPU_HEAD_SIZES)}; use tiny_kwargs like {VLLM_TINY}"
        )
    digest = hashlib.sha256(json.dumps([seed, kwargs], sort_keys=True).encode()).hexdigest()
    target = Path(data_dir) / "models" / f"tiny-{digest[:12]}"
    if (target / "config.json").exists():
        return str(target.resolve())
    from agentrl.llm.loading import load_policy

    policy = load_policy("tiny", seed=seed, tiny_kwargs=kwargs or None, data_dir=data_dir)

    def save(tmp: Path) -> None:
        policy.model.save_pretrained(tmp)
        policy.tokenizer.save_pretrained(tmp)

    return str(atomic_save(target, save).resolve())


def same_base(adapter_spec: dict[str, Any], served: dict[str, Any]) -> bool:
    """Whether an adapter's recorded base (checkpoint base.json) is the one vLLM serves."""
    return (
        str(adapter_spec.get("name", "")).lower() == str(served.get("name", "")).lower()
        and (adapter_spec.get("tiny_kwargs") or None) == (served.get("tiny_kwargs") or None)
        and int(adapter_spec.get("seed") or 0) == int(served.get("seed") or 0)
    )
