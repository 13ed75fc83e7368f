"""Settings of the training service (AGENTRL_TRAINING_* environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class TrainingSettings(BaseSettings):
    """Triggers, queue and job defaults; every field can be set as AGENTRL_TRAINING_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="AGENTRL_TRAINING_", extra="ignore")

    # Triggers
    threshold: int = Field(5000, ge=0, description="New rewarded trajectories per job; 0: off.")
    threshold_scope: Literal["global", "domain", "agent", "lineage"] = Field(
        "global",
        description="Count per task domain, per agent or per lineage (the deployment's "
        "agent -> lineage mapping; each job reads its lineage's agents only) instead of "
        "globally.",
    )
    threshold_max_jobs: int = Field(
        0,
        ge=0,
        description="Threshold jobs one run of the service fires at most, per threshold "
        "key (all, a domain, an agent or a lineage: `threshold_scope`); 0: no cap.",
    )
    schedule: str = Field("0 2 * * *", description="Cron expression (UTC); empty: off.")
    # Queue and jobs
    devices: list[str] = Field(
        default_factory=lambda: ["cpu"],
        description="One running job per entry (e.g. ['cuda:0', 'cuda:1']).",
    )
    status_every_steps: int = Field(10, gt=0, description="Progress events every N steps.")
    heartbeat_s: float = Field(2.0, gt=0.0)
    hang_timeout_s: float = Field(
        900.0, gt=0.0, description="A job silent this long is killed (failed INFRA)."
    )
    cancel_grace_s: float = Field(
        3.5, gt=0.0, description="After SIGTERM, seconds before the job is killed."
    )
    max_resumes: int = Field(2, ge=0, description="Restarts a job may resume from checkpoints.")
    warm_worker: bool = Field(
        False,
        description="Start a job launcher with the service: one process that imports torch "
        "and transformers once (~0.5 GB) and forks every job, which then skips their import "
        "(5-8 CPU-s each on 2 cores).",
    )
    launcher: str | None = Field(
        None,
        description="Unix socket of a running job launcher "
        "(`python -m agentrl.training.worker --launcher PATH`) to fork jobs from, e.g. one "
        "shared by the runners of a host; unreachable: jobs start their own processes.",
    )
    gpu_hour_price_usd: float | None = Field(None, ge=0.0, description="cost_usd when set.")
    cpu_hour_price_usd: float | None = Field(None, ge=0.0)
    # Defaults of a generated (trigger) request
    base_model: str = "smollm2"
    algorithm: str = "grpo"
    advantage_estimator: str | None = Field(
        None,
        description="e.g. 'gigpo' (travels as hyperparameters.adv_estimator with algorithm grpo).",
    )
    sample_size: int | None = Field(10000, gt=0)
    batch_size: int = Field(32, gt=0)
    epochs: int = Field(1, gt=0)
    learning_rate: float = Field(1e-5, gt=0.0)
    save_interval: int = Field(50, gt=0)
    holdout_size: float = Field(0.1, ge=0.0, lt=1.0)
    min_reward: float | None = None
    max_length: int = Field(1024, gt=8, description="Tokens per sample (prompt + action).")
    tiny_kwargs: dict[str, int] = Field(
        default_factory=dict, description="Size of the 'tiny' test model (tests and benches)."
    )
    storage_path: str | None = Field(
        None, description="Checkpoint root (default: <data_dir>/training/checkpoints)."
    )
    checkpoint_prefixes: list[str] = Field(
        default_factory=list,
        description="Where a request's checkpointing.storage_path may point besides the "
        "checkpoint root (local folders or fsspec URL prefixes); anything else is rejected.",
    )
    dataset_timeout_s: float = Field(60.0, gt=0.0)
    dataset_window_s: float | None = Field(
        None,
        gt=0.0,
        description="Generated requests read only trajectories of the last N seconds before "
        "the trigger (dataset.filter.date_range); None: everything in the stream.",
    )
    hyperparameters: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra hyperparameters of a generated request (JSON), e.g. "
        '{"objective": "awr", "minibatches": 2} for valid-action jobs.',
    )
    mixed_precision: Literal["no", "fp16", "bf16"] = Field(
        "no", description="compute.mixed_precision of a generated request."
    )
    init_from: str = Field(
        "base",
        description="Where a generated job starts: 'base', 'live' or 'latest' (the newest "
        "version of the public model that is not rejected or rolled back, read from the "
        "deployment registry's KV bucket; ':<public name>' after it picks another name), or a "
        "checkpoint folder.",
    )

    def checkpoint_root(self, data_dir: Path) -> str:
        return self.storage_path or str((data_dir / "training" / "checkpoints").resolve())
