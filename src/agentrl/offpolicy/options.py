"""The settings of `agentrl dqn` (besides the training config, `AGMConfigEntity`, whose
top-level keys are options and whose sections `--set SECTION.KEY=VALUE` reaches) and of
`agentrl bench dqn|per`: their options are drawn from these models' fields and docstrings
(`agentrl.core.configcli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_CONFIG = Path("configs/cartpole.yaml")


class _Options(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")


class DqnRun(_Options):
    """How `agentrl dqn` runs a training config: where from, on what, where to."""

    config: Path = DEFAULT_CONFIG
    """YAML config (see configs/cartpole.yaml for every key)."""
    out: Path = Path("runs/dqn")
    """Directory for metrics, figure and model."""
    apex: bool = False
    """Ape-X: actors and replay shards as Ray actors, this process learns."""
    actors: int | None = Field(None, ge=1)
    """Ape-X actor count (default distributed.actors_per_gpu)."""
    metrics_format: Literal["csv", "parquet"] = "csv"
    """Metrics file format: csv or parquet."""
    ray_address: str | None = None
    """Join a Ray cluster ('auto' after `ray start --head`)."""
    nats_url: str | None = None
    """Also publish events to NATS (agent.rl.offpolicy.*)."""


class DqnBench(_Options):
    """CartPole-v1: our Double DQN + PER, with and without smoothing + early stop, and SB3 DQN.

    Measures env steps and wall seconds until a greedy 10-episode evaluation first
    averages >= 475, steps per second, area under the learning curve, TD-error
    variance, and for (b) where early stopping fired. Last line: JSON figures
    (ours_wall_s_to_475, sb3_wall_s_to_475, ratio_vs_sb3, ours_steps_to_475, solved_seeds).
    """

    config: Path = DEFAULT_CONFIG
    """Config of agents (a) and (b)."""
    seeds: int = Field(3, ge=1)
    """Seeds 0..N-1, the same for every agent."""
    quick: bool = False
    """Stop every agent at its first greedy mean >= 475 (time to solve only). Instead of
    running the full budgets (AUC, TD variance, early-stop savings)."""
    sb3: bool = True
    """Include the stable-baselines3 peer."""


class PerBench(_Options):
    """Prioritized replay: one sample + priority update of a batch from a full memory (goal <= 0.3 ms)."""

    capacity: int = Field(1_000_000, ge=256)
    """Transitions in the memory."""
    batch: int = Field(256, ge=1)
    """Batch size sampled and updated."""
    iters: int = Field(2000, ge=10)
    """Timed repetitions."""
