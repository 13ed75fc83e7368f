"""A training job's settings as one typed model: what the service writes to the job's
`spec.json` and the job process reads, its request validated once.

Like TRL's one Config per Trainer: the request says which trainer runs (`TRAINERS`, a small
explicit table) and each trainer lists the objectives it takes, under one set of names:

- `pg`: policy gradient with PPO's clipped surrogate (the old name `ppo` is an alias);
- `awr`: advantage-weighted regression;
- `state_awr`: per-state targets softmax(log pi_start + A(s, .) / beta) (choices only);
- `rs`: rejection sampling, maximum likelihood of the trajectories with reward >= min_reward
  (tokens only).

The trainer is `hyperparameters.trainer`: `tokens` (the logged tokens, `training.jobs`) or
`choices` (valid-action turns answered from a `guided_choice`, `training.choice_job`). A
request that names none (every request before 2026-11-29) keeps the old rule: `state_awr`
means choices, else the data decides (more than half of the newest turns guided: choices).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.contracts.training import TrainingRequest
from agentrl.core.errors import TrainingError

OBJECTIVE_ALIASES = {"ppo": "pg"}  # old names still accepted


@dataclass(frozen=True)
class Trainer:
    """One trainer of dataset jobs: the objectives it takes and its default."""

    name: str
    objectives: tuple[str, ...]
    default_objective: str
    what: str


TRAINERS: dict[str, Trainer] = {
    "tokens": Trainer("tokens", ("pg", "awr", "rs"), "pg", "the logged tokens"),
    "choices": Trainer(
        "choices", ("pg", "awr", "state_awr"), "awr", "valid-action turns (guided_choice)"
    ),
}


def objective_name(name: str | None) -> str | None:
    """The objective's one name (`ppo` -> `pg`); None stays None (the trainer's default)."""
    if name is None:
        return None
    return OBJECTIVE_ALIASES.get(str(name), str(name))


class JobOptions(BaseModel):
    """The hyperparameters' extras a dataset job reads (the request's `hyperparameters`
    beyond the published schema); unknown extras are kept for the trainers."""

    model_config = ConfigDict(extra="allow")

    trainer: Literal["auto", "tokens", "choices"] = "auto"
    objective: str | None = None
    seed: int = 0
    threads: int = 0
    awr_beta: float = Field(0.5, gt=0.0)
    awr_max_weight: float = Field(20.0, gt=0.0)
    min_reward: float = 1.0
    kl_coef: float = 0.0
    constraints: list[Any] = Field(default_factory=list)
    advantage_scale: Literal["std", "none"] = "std"
    """A group's centred rewards divided by its std (GRPO) or not (Dr. GRPO; the tool-use
    loop's, whose partial credit made small differences as large as a success's):
    `training.samples.ADVANTAGE_SCALES`."""

    @field_validator("objective", mode="before")
    @classmethod
    def _one_name(cls, value: Any) -> Any:
        return objective_name(value) if value is not None else None


class JobSpec(BaseModel):
    """What one job process needs: the request and where to run it. Extra keys of an older
    or newer service are kept, not refused."""

    model_config = ConfigDict(extra="allow")

    request: TrainingRequest
    kind: Literal["dataset", "environment"] = "dataset"
    job_dir: str = "."
    nats_url: str | None = None
    device: str = "cpu"
    storage_path: str = ""
    resume: bool = False
    status_every_steps: int = 10
    heartbeat_s: float = 2.0
    max_length: int = 1024
    tiny_kwargs: dict[str, Any] | None = None
    lease: dict[str, Any] | None = None
    recent_checkpoint: str | None = None
    init_checkpoint: str | None = None  # resolved from `init_from` when the data is read
    api_url: str | None = None

    @classmethod
    def of(cls, spec: JobSpec | dict[str, Any]) -> JobSpec:
        """`spec` as a JobSpec (a dict as the service wrote it, or one already parsed); an
        invalid request is a CONFIG error of the job."""
        if isinstance(spec, JobSpec):
            return spec
        try:
            return cls.model_validate(spec)
        except ValueError as exc:
            raise TrainingError(f"invalid job spec: {exc}", "CONFIG") from exc

    @cached_property
    def options(self) -> JobOptions:
        extra = self.request.training_config.hyperparameters.model_extra or {}
        try:
            return JobOptions.model_validate(extra)
        except ValueError as exc:
            raise TrainingError(f"invalid hyperparameters: {exc}", "CONFIG") from exc

    @property
    def extra(self) -> dict[str, Any]:
        """The hyperparameters' extras as given (trainer-specific knobs)."""
        return dict(self.request.training_config.hyperparameters.model_extra or {})

    @property
    def estimator(self) -> str:
        from agentrl.training.requests import estimator

        return estimator(self.request)

    def trainer_named(self) -> str:
        """The trainer the request names: tokens, choices, or auto (decided by the data)."""
        if self.options.trainer != "auto":
            return self.options.trainer
        if self.options.objective == "state_awr":
            return "choices"
        return "auto"

    def objective(self, trainer: str) -> str:
        """The objective for `trainer`: the request's (one name) or the trainer's default;
        one the trainer does not take is a CONFIG error."""
        t = TRAINERS[trainer]
        objective = self.options.objective or t.default_objective
        if objective not in t.objectives:
            others = [n for n, o in TRAINERS.items() if objective in o.objectives]
            raise TrainingError(
                f"objective {objective!r}: the {trainer} trainer ({t.what}) takes "
                f"{', '.join(t.objectives)}"
                + (f"; {objective!r} is the {others[0]} trainer's" if others else ""),
                "CONFIG",
            )
        return objective
