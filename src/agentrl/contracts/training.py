"""`agent.rl.training.request.v1` and `agent.rl.training.status.v1` (seed 000, sections 3-4).

Wire values follow PMOVES.AI's published schemas, while agentrl's code keeps its own names:
- algorithm `gigpo` travels as `grpo` with `hyperparameters.adv_estimator: "gigpo"` (verl's
  convention) and comes back as `gigpo`; `gigpo` is also accepted as input shorthand;
- `compute.mixed_precision` `no` travels as `fp32` (`fp32` reads back as `no`);
- error codes agentrl adds (`CONFIG`, `CANCELLED`) travel as `UNKNOWN` with `detail_code`;
- `progress.total_epochs` / `total_steps` are >= 1 or absent (0 on input means unknown);
- dataset source `file` is deprecated input for `local`.
"""

from __future__ import annotations

import warnings
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

from agentrl.contracts.base import (
    Event,
    Finite,
    NonNegative,
    Part,
    Percent,
    Timestamp,
    new_id,
    noop_when_valid,
    with_field,
)
from agentrl.contracts.trajectory import Domain

Algorithm = Literal["ppo", "dpo", "rloo", "grpo", "reinforce", "gigpo"]
TriggerReason = Literal["scheduled", "threshold_reached", "manual", "performance_degradation"]
JobStatus = Literal["queued", "running", "completed", "failed", "cancelled"]
ErrorCode = Literal[
    "OOM", "CONVERGENCE", "DATA", "INFRA", "TIMEOUT", "UNKNOWN", "CONFIG", "CANCELLED"
]
WIRE_ERROR_CODES = ("OOM", "CONVERGENCE", "DATA", "INFRA", "TIMEOUT", "UNKNOWN")
Priority = Literal["low", "normal", "high", "urgent"]
# A training job id becomes a folder name: a UUID or [A-Za-z0-9_-]{1,64}, nothing that
# could name another path ("../..", "/tmp/x").
JobId = Annotated[str, StringConstraints(strip_whitespace=True, pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class DateRange(Part):
    start: Timestamp
    end: Timestamp

    @model_validator(mode="after")
    def _ordered(self) -> DateRange:
        if self.end < self.start:
            raise ValueError("date_range.end is before date_range.start")
        return self


class DatasetFilter(Part):
    min_reward: Finite | None = None
    max_trajectory_length: int | None = Field(None, gt=0)
    date_range: DateRange | None = None
    task_domains: list[Domain] = Field(default_factory=list)
    exclude_subordinate_profiles: list[str] = Field(default_factory=list)


class Dataset(Part):
    source: Literal["nats_stream", "clickhouse", "s3", "local"] = "nats_stream"
    stream_name: str = "RL_TRAJECTORIES"
    filter: DatasetFilter = Field(default_factory=DatasetFilter)
    sample_size: int = Field(
        10_000, gt=0, description="Required by the published schema; the seed's value."
    )

    @model_validator(mode="before")
    @classmethod
    @noop_when_valid  # 'file' fails the Literal, null fails `int`
    def _old_values(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("source") == "file":
                warnings.warn(
                    "dataset.source 'file' is deprecated: use 'local'",
                    DeprecationWarning,
                    stacklevel=2,
                )
                data = {**data, "source": "local"}
            if "sample_size" in data and data["sample_size"] is None:
                data = {k: v for k, v in data.items() if k != "sample_size"}
        return data


class Hyperparameters(Part):
    learning_rate: float = Field(1e-5, gt=0.0, allow_inf_nan=False)
    batch_size: int = Field(32, gt=0)
    epochs: int = Field(1, gt=0)
    clip_epsilon: float = Field(0.2, gt=0.0, allow_inf_nan=False)
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0)
    adv_estimator: str | None = Field(
        None, description="verl's advantage estimator; 'gigpo' marks a GiGPO job."
    )


class Compute(Part):
    gpu_count: int = Field(0, ge=0)
    gpu_type: str | None = None
    distributed: bool = False
    mixed_precision: Literal["no", "fp16", "bf16"] = Field(
        "no", description="'no' travels as the schema's 'fp32'."
    )

    @model_validator(mode="before")
    @classmethod
    @noop_when_valid  # 'fp32' fails the Literal
    def _fp32(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("mixed_precision") == "fp32":
            data = {**data, "mixed_precision": "no"}
        return data

    @model_serializer(mode="wrap")
    def _wire(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("mixed_precision") == "no":
            out["mixed_precision"] = "fp32"
        return out


class Checkpointing(Part):
    save_interval: int = Field(1000, gt=0)
    max_checkpoints: int = Field(5, gt=0)
    storage_path: str = "./.agentrl/checkpoints"


class TrainingConfig(Part):
    algorithm: Algorithm
    base_model: str
    dataset: Dataset = Field(default_factory=Dataset)
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    compute: Compute = Field(default_factory=Compute)
    checkpointing: Checkpointing = Field(default_factory=Checkpointing)

    @model_validator(mode="before")
    @classmethod
    def _gigpo_from_wire(cls, data: Any) -> Any:
        # in memory: algorithm "gigpo" with adv_estimator "gigpo"; on the wire: grpo + gigpo
        if not isinstance(data, dict) or data.get("algorithm") not in ("grpo", "gigpo"):
            return data
        hp = data.get("hyperparameters")
        if data["algorithm"] == "gigpo":
            return {**data, "hyperparameters": with_field(hp, "adv_estimator", "gigpo")}
        est = (
            hp.get("adv_estimator") if isinstance(hp, dict) else getattr(hp, "adv_estimator", None)
        )
        if est == "gigpo":
            data = {**data, "algorithm": "gigpo"}
        return data

    @model_serializer(mode="wrap")
    def _wire(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("algorithm") == "gigpo":
            out["algorithm"] = "grpo"
            out["hyperparameters"] = {**out.get("hyperparameters", {}), "adv_estimator": "gigpo"}
        return out


class Evaluation(Part):
    enabled: bool = True
    holdout_size: float = Field(0.1, ge=0.0, lt=1.0)
    metrics: list[str] = Field(default_factory=lambda: ["reward"])
    benchmark_tasks: list[str] = Field(default_factory=list)


class RequestMetadata(Part):
    requested_by: str | None = None
    previous_training_job: str | None = None
    notes: str | None = None


class TrainingRequest(Event):
    SUBJECT: ClassVar[str] = "agent.rl.training.request.v1"
    ID_FIELD: ClassVar[str | None] = "training_job_id"

    training_job_id: JobId = Field(default_factory=new_id)
    timestamp: Timestamp
    requester: str
    trigger_reason: TriggerReason
    training_config: TrainingConfig
    evaluation: Evaluation = Field(default_factory=Evaluation)
    priority: Priority = "normal"
    metadata: RequestMetadata = Field(default_factory=RequestMetadata)


class Progress(Part):
    current_epoch: int = Field(0, ge=0)
    total_epochs: int | None = Field(None, ge=1, description=">= 1, or absent when unknown.")
    current_step: int = Field(0, ge=0)
    total_steps: int | None = Field(None, ge=1, description=">= 1, or absent when unknown.")
    percent_complete: Percent = 0.0
    eta_seconds: NonNegative | None = None

    @model_validator(mode="before")
    @classmethod
    @noop_when_valid  # 0 fails `ge=1`
    def _zero_is_unknown(cls, data: Any) -> Any:
        if isinstance(data, dict) and (
            data.get("total_epochs") == 0 or data.get("total_steps") == 0
        ):
            data = {
                k: v
                for k, v in data.items()
                if not (k in ("total_epochs", "total_steps") and v == 0)
            }
        return data


class CurrentMetrics(Part):
    loss: Finite | None = None
    reward_mean: Finite | None = None
    reward_std: NonNegative | None = None
    policy_entropy: Finite | None = None
    kl_divergence: Finite | None = None
    learning_rate: NonNegative | None = None


class BestMetrics(Part):
    epoch: int = Field(0, ge=0)
    step: int = Field(0, ge=0)
    reward_mean: Finite | None = None
    checkpoint_path: str | None = None


class StatusMetrics(Part):
    current: CurrentMetrics = Field(default_factory=CurrentMetrics)
    best: BestMetrics | None = None


class EvaluationResults(Part):
    holdout_reward: Finite | None = None
    benchmark_scores: dict[str, Finite] = Field(default_factory=dict)
    improvement_over_baseline: Finite | None = None


class Artifacts(Part):
    final_checkpoint: str | None = None
    tensorboard_logs: str | None = None
    training_curves: str | None = None
    model_card: str | None = None


class ResourceUsage(Part):
    gpu_hours: NonNegative | None = None
    cost_usd: NonNegative | None = None
    peak_memory_gb: NonNegative | None = None
    total_training_time_seconds: NonNegative | None = None


class StatusError(Part):
    code: ErrorCode
    message: str | None = None
    traceback: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _detail_from_wire(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and data.get("code") == "UNKNOWN"
            and data.get("detail_code") in ("CONFIG", "CANCELLED")
        ):
            detail = data["detail_code"]
            data = {k: v for k, v in data.items() if k != "detail_code"}
            data["code"] = detail
        return data

    @model_serializer(mode="wrap")
    def _wire(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("code") not in WIRE_ERROR_CODES:
            out["detail_code"] = out["code"]
            out["code"] = "UNKNOWN"
        return out


class StatusMetadata(Part):
    training_platform: str | None = None
    cuda_version: str | None = None
    pytorch_version: str | None = None


class TrainingStatus(Event):
    """Status events have no id of their own: the content hash de-duplicates them."""

    SUBJECT: ClassVar[str] = "agent.rl.training.status.v1"

    training_job_id: JobId
    timestamp: Timestamp
    status: JobStatus
    progress: Progress = Field(default_factory=Progress)
    metrics: StatusMetrics = Field(default_factory=StatusMetrics)
    evaluation_results: EvaluationResults | None = None
    artifacts: Artifacts | None = None
    resource_usage: ResourceUsage | None = None
    error: StatusError | None = None
    metadata: StatusMetadata | None = None

    @model_validator(mode="after")
    def _failure_explained(self) -> TrainingStatus:
        if self.status == "failed" and self.error is None:
            raise ValueError("a status of 'failed' needs an error block (code, message)")
        return self
