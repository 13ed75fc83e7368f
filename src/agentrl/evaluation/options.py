"""The settings of `agentrl bench trainer|learning|learning-freeform`: their options are
drawn from these models' fields and docstrings (`agentrl.core.configcli`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class _Options(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


class TrainerBench(_Options):
    """Tokens/s of one policy-gradient update (forward, backward, clip, AdamW) on 8
    sequences of 100 prompt + 32 action tokens: ours vs TRL's GRPOTrainer loss vs a plain
    PyTorch loop with the LM head on action positions only (the ceiling). Timed in turns
    so machine load hits all three alike."""

    cases: str = "tiny,smollm2-full,smollm2-lora"
    """Comma list of: tiny, smollm2-full, smollm2-lora. SmolLM2 LoRA is the headline."""
    rounds: int = Field(3, ge=1)
    """Timed updates per implementation (median)."""
    warmup: int = Field(1, ge=0)
    """Untimed updates first."""
    threads: int | None = Field(None, ge=1)
    """Torch threads (unset: torch's default). 1 is steadier on a busy machine."""


class LearningBench(_Options):
    """GiGPO vs GRPO vs RLOO at equal episode budgets, >= 5 seeds: FrozenLake 4x4 (`agentrl
    learn`'s configuration: base/trained held-out success, seconds to 0.7), a
    curriculum (6x6 maps from each seed's 4x4 adapter) and one-box Sokoban. Final
    held-out success with 95 % intervals (t over seeds, pooled Wilson), wall and CPU
    seconds to 0.5 and 0.7, a PNG per setting. One line per iteration on stderr; the
    last stdout line is one JSON object (base_success, trained_success, seconds_to_070,
    gigpo/grpo/rloo_final_success, gigpo/grpo_seconds_to_050, gigpo/grpo_ci_low/high,
    seeds, wall_s, then extras: cpu_s, load, sokoban_*)."""

    config: Path = Path("configs/frozenlake-valid-action.yaml")
    """The 4x4 learning config."""
    seeds: int = Field(5, ge=1)
    """Training seeds per algorithm and setting."""
    jobs: int = Field(1, ge=1)
    """Worker processes (seeds split between them, 1 torch thread each)."""
    settings: str = "fl4,curriculum,sokoban"
    """Comma list of: fl4, curriculum, sokoban; or tooluse alone (configs/tooluse-*.yaml)."""
    algorithms: str = "gigpo,grpo,rloo"
    """Comma list of algorithms."""
    model: str | None = None
    """Another model than the config's (e.g. a larger one on a GPU)."""
    iterations_scale: float = Field(1.0, ge=0.01)
    """Multiply every setting's iterations (10 for the GPU run)."""
    threads: int | None = Field(None, ge=1)
    """Torch threads (unset: picked by the load)."""
    out: Path = Path("runs/bench-learning")
    """Runs, PNG and JSON go here."""
    quick: bool = False
    """A tiny random model and 2 iterations: seconds."""
    collect_only: bool = False
    """Run nothing: summarise OUT/runs.jsonl (e.g. after an interruption)."""
    reuse: bool = False
    """Reuse the 4x4 runs (adapter + optimiser) saved under OUT/warm."""
    fl4_every_algorithm: bool = False
    """Run the 4x4 setting from the base for every algorithm (not GiGPO only). The
    comparison where learning starts at 0."""


class FreeformBench(_Options):
    """GiGPO vs GRPO with equal episode budgets on text FrozenLake and Sokoban: success
    rate per iteration (mean over seeds) for each, as a PNG and JSON. Budgets are small on
    CPU; the figures say what was measured, not what a GPU run would reach."""

    envs: str = "frozenlake-4x4,sokoban"
    """Comma list of environments."""
    seeds: int = Field(3, ge=1)
    """Training seeds per algorithm."""
    iterations: int = Field(6, ge=1)
    """Rollout + update rounds per run."""
    tasks_per_iteration: int = Field(4, ge=1)
    """Tasks (groups) per iteration."""
    group_size: int = Field(4, ge=2)
    """Episodes per task."""
    max_steps: int = Field(6, ge=1)
    """Turns per episode."""
    model: str = "smollm2"
    """Model: smollm2 or tiny."""
    learning_rate: float = Field(2e-4, ge=0.0)
    """The optimiser's learning rate."""
    max_new_tokens: int = Field(16, ge=1)
    """Tokens per reply."""
    temperature: float = Field(0.8, ge=0.01)
    """Rollout sampling temperature."""
    batch_size: int = Field(8, ge=1)
    """Samples per optimiser step."""
    out: Path = Path("runs/bench-learning")
    """PNG + JSON go here."""
