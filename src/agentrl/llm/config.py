"""Every knob of the policy trainer in one place (TRL style: a Config next to the trainer).

Field names follow the seed's `agent.rl.training.request.v1` payload where it has one
(learning_rate, batch_size, epochs, clip_epsilon, gamma, gae_lambda, save_interval,
max_checkpoints, storage_path); `from_training_request` maps that payload onto this.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.core.errors import TrainingError

if TYPE_CHECKING:
    from agentrl.contracts.training import TrainingRequest

ALGORITHMS = ("gigpo", "grpo", "rloo", "ppo", "dpo")
Algorithm = Literal["gigpo", "grpo", "rloo", "ppo", "dpo"]


class TrainerConfig(BaseModel):
    """Configuration of one training run of `PolicyTrainer`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    algorithm: Algorithm = "gigpo"
    model: str = Field("smollm2", description="'smollm2', 'tiny', a HF id or a local folder.")
    # LoRA (peft); lora_r=0 trains all weights.
    lora_r: int = Field(16, ge=0)
    lora_alpha: int = Field(32, gt=0)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    lora_layers: list[int] | None = Field(
        None, description="Decoder layers with adapters (None: all), e.g. a continued start's."
    )
    dtype: Literal["fp32", "bf16"] = "fp32"
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    device: str = "cpu"

    # Optimisation
    learning_rate: float = Field(1e-5, gt=0.0, allow_inf_nan=False)
    batch_size: int = Field(32, gt=0, description="Samples (steps or pairs) per optimiser step.")
    epochs: int = Field(1, gt=0, description="Passes over each batch of samples.")
    micro_batch_tokens: int = Field(4096, gt=0, description="Padded tokens per forward pass.")
    share_prefix: bool = Field(
        True,
        description="Run the prompt tokens all rows of a micro-batch begin with once "
        "(`forward.PolicyHead`): same log-probs and gradients up to rounding, about half a "
        "tool-use job's forward and backward.",
    )
    max_length: int = Field(2048, gt=8)
    weight_decay: float = Field(0.0, ge=0.0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = Field(1.0, gt=0.0)
    warmup_steps: int = Field(0, ge=0)
    total_steps: int | None = Field(None, gt=0, description="Cosine horizon; None: constant.")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = 0

    # Policy-gradient objective
    clip_epsilon: float = Field(0.2, gt=0.0, lt=1.0)
    clip_epsilon_high: float | None = Field(None, gt=0.0, description="DAPO clip-higher.")
    loss_aggregation: Literal["token", "sequence"] = "token"
    policy_loss: Literal["ppo_clip", "weighted_nll"] = Field(
        "ppo_clip",
        description="ppo_clip: the clipped surrogate; weighted_nll: -A * log pi(a) "
        "(advantage-weighted regression, rejection sampling: non-negative weights).",
    )
    kl_coef: float = Field(0.0, ge=0.0, description="k3 KL penalty to the reference policy.")
    entropy_coef: float = Field(0.0, ge=0.0)
    exact_entropy: bool = Field(
        False,
        description="Compute the entropy metric over the vocabulary; otherwise it is the sample "
        "estimate -mean log pi(a) (free). Always exact when entropy_coef > 0.",
    )
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of the rollout.")
    recompute_old_logprobs: bool = False
    skip_zero_advantage: bool = True
    history_window: int | None = Field(None, ge=0, description="Non-system messages kept.")

    # Advantages (GiGPO / GAE)
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0)
    gigpo_omega: float = Field(1.0, ge=0.0, description="Weight of the step-level advantage.")
    vf_coef: float = Field(0.5, ge=0.0)
    value_clip: float | None = 0.2
    dpo_beta: float = Field(0.1, gt=0.0)

    # Scale-out and checkpoints
    distributed: bool = False
    save_interval: int = Field(1000, gt=0, description="Optimiser steps between checkpoints.")
    max_checkpoints: int = Field(5, gt=0)
    storage_path: str = "./.agentrl/checkpoints"
    storage_options: dict[str, Any] = Field(
        default_factory=dict, description="fsspec options, e.g. {'endpoint_url': ...} for MinIO."
    )

    @field_validator("algorithm", mode="before")
    @classmethod
    def _known_algorithm(cls, value: Any) -> Any:
        if isinstance(value, str) and value.lower() in ALGORITHMS:
            return value.lower()
        raise TrainingError(
            f"unknown algorithm {value!r}; choose one of {', '.join(ALGORITHMS)}", "DATA"
        )

    @property
    def is_lora(self) -> bool:
        return self.lora_r > 0

    @classmethod
    def from_training_request(cls, request: TrainingRequest, **overrides: Any) -> TrainerConfig:
        """Map the seed's training request onto a trainer config (overrides win)."""
        tc = request.training_config
        hp, comp, ck = tc.hyperparameters, tc.compute, tc.checkpointing
        values: dict[str, Any] = {
            "algorithm": tc.algorithm,
            "model": tc.base_model,
            "learning_rate": hp.learning_rate,
            "batch_size": hp.batch_size,
            "epochs": hp.epochs,
            "clip_epsilon": hp.clip_epsilon,
            "gamma": hp.gamma,
            "gae_lambda": hp.gae_lambda,
            "distributed": comp.distributed,
            "mixed_precision": comp.mixed_precision,
            "device": "cuda" if comp.gpu_count > 0 else "cpu",
            "save_interval": ck.save_interval,
            "max_checkpoints": ck.max_checkpoints,
            "storage_path": ck.storage_path,
        }
        values.update(overrides)
        return cls(**values)


def is_tooluse_config(path: Path) -> bool:
    """A tool-use learning config: named tooluse-*.yaml or saying `kind: tooluse`."""
    if path.name.startswith("tooluse"):
        return True
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and data.get("kind") == "tooluse"
