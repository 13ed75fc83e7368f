"""The settings of `agentrl learn`, `agentrl train-sft` and the retired `agentrl train-policy`:
the commands draw their options from these models' fields and docstrings
(`agentrl.core.configcli`); `--set FIELD=VALUE` reaches the fields without an option."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Options(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


class PolicyOptions(_Options):
    """`agentrl train-policy`: a `TrainerConfig` and the on-policy loop's `LoopSettings`."""

    env: str = "frozenlake-4x4"
    """Text environment: sokoban, frozenlake-4x4, frozenlake-8x8, tooluse."""
    algorithm: str = "gigpo"
    """Update rule: gigpo, grpo, rloo, ppo or dpo."""
    model: str = "smollm2"
    """'smollm2' (bundled, no download), 'tiny' (random, for smoke runs), a Hugging Face id or
    a local folder (also a checkpoint folder with LoRA adapters)."""
    iterations: int = Field(10, ge=1)
    """Rollout + update rounds."""
    tasks_per_iteration: int = Field(4, ge=1)
    """Distinct task seeds per round."""
    group_size: int = Field(4, ge=1)
    """Episodes per task seed (the GRPO/GiGPO group)."""
    max_steps: int = Field(8, ge=1)
    """Step limit of an episode."""
    max_new_tokens: int = Field(24, ge=1)
    """Generated tokens per action."""
    temperature: float = Field(1.0, ge=0.01)
    """Sampling temperature of rollouts."""
    history_window: int = Field(2, ge=0)
    """Past turns the policy sees."""
    lora_r: int = Field(16, ge=0)
    """LoRA rank; 0 trains all weights."""
    learning_rate: float = Field(2e-4, ge=0.0)
    """AdamW learning rate."""
    batch_size: int = Field(32, ge=1)
    """Steps (samples) per optimiser step."""
    epochs: int = Field(1, ge=1)
    """Passes over each round's samples."""
    kl_coef: float = Field(0.0, ge=0.0)
    """k3 KL penalty to the reference."""
    seed: int = 0
    """Seeds model init, task seeds and sampling."""
    out: Path = Path("runs/train-policy")
    """Curve PNG + metrics JSON."""
    storage_path: str | None = None
    """Checkpoints: a folder or s3://bucket/prefix (default: OUT/checkpoints)."""
    s3_endpoint: str | None = None
    """S3/MinIO endpoint URL for s3:// paths."""
    save_interval: int = Field(50, ge=1)
    """Optimiser steps between checkpoints."""
    max_checkpoints: int = Field(3, ge=1)
    """Step checkpoints kept (rotation)."""
    eval_episodes: int = Field(8, ge=0)
    """Greedy holdout episodes per round, for best/; 0 keeps no best/."""
    resume: bool = False
    """Resume from the latest checkpoint."""
    nproc: int = Field(1, ge=1)
    """Processes for DistributedDataParallel (relaunches under torchrun; gloo on CPU, nccl on
    GPU). Each rank rolls out its own tasks; all share the samples."""


class SFTOptions(_Options):
    """`agentrl train-sft`: a `TrainerConfig` and the `SFTSettings`."""

    model: str = "smollm2"
    """'smollm2', 'tiny', a HF id or a folder."""
    env: str = "frozenlake-4x4"
    """Non-slippery FrozenLake (BFS expert)."""
    obs_format: str = "egocentric"
    """grid or egocentric observations."""
    train_maps: int = Field(24, ge=1)
    """Maps the expert demonstrates."""
    heldout_maps: int = Field(50, ge=1)
    """Held-out maps, before and after."""
    epochs: int = Field(2, ge=1)
    """Passes over the demonstrations."""
    batch_size: int = Field(16, ge=1)
    """Demonstration steps per update."""
    learning_rate: float = Field(5e-4, ge=0.0)
    """AdamW learning rate."""
    lora_r: int = Field(16, ge=0)
    """LoRA rank; 0 trains all weights."""
    max_steps: int = Field(8, ge=1)
    """Step limit of a held-out episode."""
    max_new_tokens: int = Field(6, ge=1)
    """Generated tokens per action."""
    seed: int = 0
    """Seeds model init, map seeds and shuffling."""
    out: Path = Path("runs/sft")
    """Checkpoint (OUT/checkpoints/final)."""


class LearnOptions(_Options):
    """`agentrl learn`: a learning config file and what to change in it (unset: the file's)."""

    config: Path = Path("configs/frozenlake-valid-action.yaml")
    """A valid-action learning config."""
    iterations: int | None = Field(None, ge=1)
    """Override the config's iterations."""
    algorithm: str | None = None
    """Override: gigpo, grpo, rloo or ppo."""
    model: str | None = None
    """Override: 'smollm2', 'tiny', a HF id or folder."""
    heldout_seeds: int | None = Field(None, ge=1)
    """Override: held-out maps."""
    time_budget_s: float | None = Field(None, ge=1)
    """Override: training seconds."""
    seed: int | None = None
    """Override the config's seed."""
    out: str | None = None
    """Override: output folder (adapter, PNG, JSON)."""
    data_program: Literal["canonical", "shown"] | None = None
    """Tool use: how the scripted data programs hold the table.

    canonical or shown (`solver.DATA_PROGRAMS`): the warm start's demonstrations, the hints'
    plan and the replayed warm-start episodes; unset: the config's (canonical). Recorded in
    the checkpoints' metrics.json and result.json; a tool-use config only."""
