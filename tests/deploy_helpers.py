"""Helpers of the deploy tests (a module of its own: test files import it by name)."""

from __future__ import annotations

import socket
from pathlib import Path

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}


def write_checkpoint(folder: Path, seed: int, scale: float = 0.5) -> str:
    """A LoRA checkpoint of the tiny base (adapter weights random, so versions differ)."""
    # torch here, not at the top: the plugin that imports this module loads in pytest's
    # controller too, which runs no test (its start-up comes before any worker's: ~3 CPU-s)
    import torch

    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.loading import LoraSettings, apply_lora, load_policy
    from agentrl.llm.trainer import PolicyTrainer

    cfg = TrainerConfig(
        model="tiny",
        lora_r=4,
        batch_size=2,
        warmup_steps=1,
        total_steps=2,
        storage_path=str(folder),
    )
    policy = load_policy("tiny", seed=0, tiny_kwargs=TINY)
    policy.lora = LoraSettings(r=4, target_modules=("q_proj", "v_proj"))
    policy.model = apply_lora(policy.model, policy.lora)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    trainer = PolicyTrainer(policy, cfg)
    return CheckpointManager(str(folder)).save(trainer, {"reward": 0.5}, name="final")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
