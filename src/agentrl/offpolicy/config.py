"""Training configuration: `AGMConfigEntity` and the YAML loader.

The sections `replay`, `kernel_smoothing`, `early_stopping` and `distributed` carry
every key of the seed's YAML example, with the same names and meanings; `env_id`,
`total_steps`, `network`, `optimiser`, `dqn` and `evaluation` complete it into a
runnable trainer. Three names are easy to mix up and are kept apart on purpose:
`kernel_smoothing.alpha_step_*` (smoother step size), `kernel_smoothing.dim_exponent`
(the exponent in dt = d^-dim_exponent) and `replay.alpha` (the PER priority exponent).

Every value is range-checked at construction; a bad one raises `OffPolicyConfigError`
naming the key, the value and the allowed range. Unknown keys are rejected (typos
should not silently fall back to defaults).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl.core.errors import ConfigError

SCHEMA_VERSION = 1


class OffPolicyConfigError(ConfigError):
    """An off-policy training configuration is invalid; the message names the key."""


def _coerce_numeric_string(value: Any) -> Any:
    """YAML 1.1 (PyYAML) reads `1e-3` as a string; accept any numeric string as a number."""
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            return value
        if number.is_integer() and re.fullmatch(r"[+-]?\d+", text):
            return int(text)
        return number
    return value


_TEXT_TYPES: tuple[Any, ...] = (str, str | None)


class _Section(BaseModel):
    """Frozen, strict about unknown keys, lenient about numeric strings."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _numbers_from_strings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            k: v
            if k in fields and fields[k].annotation in _TEXT_TYPES
            else _coerce_numeric_string(v)
            for k, v in data.items()
        }


class NetworkConfig(_Section):
    """Q-network: an MLP encoder to a latent of `kernel_smoothing.latent_dim`, then a linear Q head."""

    hidden: tuple[int, ...] = Field((64,), description="Hidden layer widths before the latent.")
    activation: Literal["relu", "tanh", "elu", "gelu"] = "relu"
    dueling: bool = Field(False, description="Split the head into value and advantage streams.")

    @field_validator("hidden")
    @classmethod
    def _positive_widths(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(w < 1 or w > 65536 for w in v):
            raise ValueError(f"every width must be in [1, 65536], got {list(v)}")
        return v


class OptimiserConfig(_Section):
    name: Literal["adam", "adamw", "rmsprop", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0.0, le=1.0)
    adam_eps: float = Field(1e-8, gt=0.0, le=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    max_grad_norm: float | None = Field(10.0, gt=0.0, description="Gradient-norm clip; null = off.")


class DQNConfig(_Section):
    """Double DQN: targets, losses, exploration and update cadence."""

    gamma: float = Field(0.99, gt=0.0, le=1.0)
    n_step: int = Field(1, ge=1, le=100)
    double: bool = Field(
        True, description="Double DQN (online argmax, target value); false = vanilla."
    )
    loss: Literal["huber", "mse"] = "huber"
    huber_delta: float = Field(1.0, gt=0.0)
    target_update: Literal["hard", "polyak"] = "hard"
    target_update_interval: int = Field(
        500, ge=1, description="Learner updates between hard copies."
    )
    tau: float = Field(0.005, gt=0.0, le=1.0, description="Polyak coefficient per update.")
    learning_starts: int = Field(1000, ge=0, description="Env steps collected before learning.")
    train_every: int = Field(1, ge=1, description="Vector-env steps between learner phases.")
    gradient_steps: int = Field(1, ge=1, le=10000, description="Learner updates per phase.")
    epsilon_start: float = Field(1.0, ge=0.0, le=1.0)
    epsilon_end: float = Field(0.05, ge=0.0, le=1.0)
    epsilon_decay_steps: int = Field(10000, ge=1, description="Env steps of linear decay.")


class ReplayConfig(_Section):
    """Replay memory. `alpha` is the PER priority exponent (not the smoother's alpha_step)."""

    batch_size: int = Field(256, ge=1, le=65536)
    prioritized_replay: bool = True
    alpha: float = Field(0.6, ge=0.0, le=1.0, description="PER priority exponent.")
    beta0: float = Field(0.4, ge=0.0, le=1.0, description="Initial IS exponent, annealed to 1.")
    beta_anneal_steps: int | None = Field(
        None, ge=1, description="Env steps to reach beta=1; null = total_steps."
    )
    capacity: int = Field(100_000, ge=1, le=100_000_000)
    priority_eps: float = Field(1e-6, gt=0.0, le=1.0)


class KernelSmoothingConfig(_Section):
    """Batch-local kernel-weighted drift smoother (seed: 'Kernel Smoothing (Batch-Level)').

    Off unless `enabled: true` (the section also sets the network's `latent_dim`).
    """

    enabled: bool = False
    k: int = Field(16, ge=1, le=4096)
    sigma_min: float = Field(1e-3, gt=0.0)
    sigma_max: float = Field(1.0, gt=0.0)
    alpha_step_init: float = Field(0.15, ge=0.0, le=1.0, description="Smoother step size.")
    alpha_step_final: float = Field(0.0, ge=0.0, le=1.0)
    alpha_step_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    alpha_step_decay_steps: int = Field(100_000, ge=1, description="Learner updates to decay over.")
    dim_exponent: float = Field(0.5, ge=0.0, le=4.0, description="dt = latent_dim^-dim_exponent.")
    trust_region_tau: float = Field(0.1, gt=0.0, description="Max ||dh|| per sample, units of h.")
    latent_dim: int = Field(64, ge=1, le=65536, description="Width of the encoder latent z.")
    gate_by_td_variance: bool = True
    td_var_min: float = Field(0.0, ge=0.0, description="Gate: local TD variance must exceed this.")
    disagreement_min: float = Field(0.0, ge=0.0, description="...or ||G[h]_i - h_i|| this.")
    scale_preservation: bool = False
    noise_std: float = Field(0.0, ge=0.0, description="Std of eta, added before clipping.")
    apply_to: Literal["td_targets", "latents"] = "td_targets"
    consensus_reg: float = Field(0.0, ge=0.0, description="lambda of the Q-head consensus term.")
    free_energy_weight: float = Field(0.0, ge=0.0, description="lambda_F of F in the loss.")
    temperature: float = Field(1.0, ge=0.0, description="T in F = U - T*S.")
    knn_block_size: int = Field(1024, ge=1, description="Rows per cdist block.")

    @model_validator(mode="after")
    def _sigma_order(self) -> KernelSmoothingConfig:
        if self.sigma_min > self.sigma_max:
            raise ValueError(
                f"sigma_min ({self.sigma_min}) must be <= sigma_max ({self.sigma_max})"
            )
        return self


class CostWeights(_Section):
    """Weights of the early-stop cost (seed example 0.3 / 0.5 / 0.2)."""

    td_distortion: float = Field(0.3, ge=0.0)
    local_structure: float = Field(0.5, ge=0.0)
    plateau_risk: float = Field(0.2, ge=0.0)

    @model_validator(mode="after")
    def _not_all_zero(self) -> CostWeights:
        if self.td_distortion + self.local_structure + self.plateau_risk <= 0:
            raise ValueError("at least one cost weight must be > 0")
        return self


class EarlyStoppingConfig(_Section):
    """Q-grounded multi-criteria early stopping (seed: 'Early Stopping Controller').

    Writing the section turns it on (the seed's example has no `enabled` key); leave the
    section out or set `enabled: false` to train for the whole budget.
    """

    enabled: bool = True
    eval_interval: int = Field(5000, ge=1, description="Learner updates between evaluations.")
    eval_episodes: int = Field(10, ge=1, le=1000)
    patience: int = Field(10, ge=1)
    hysteresis_pct: float = Field(0.03, ge=0.0, le=0.5)
    td_ema_beta: float = Field(0.9, ge=0.0, lt=1.0)
    plateau_threshold: float = Field(
        0.5, ge=0.0, description="|reward slope| per eval for plateau."
    )
    reward_window: int = Field(5, ge=2, description="W3: evals in the reward moving average/slope.")
    q_window: int = Field(3, ge=1, description="W2: evals over which Q relative change is taken.")
    q_change_scale: float = Field(0.05, gt=0.0, description="Q rel. change that halves structure.")
    td_rel_scale: float = Field(0.05, gt=0.0, description="|TD|/|Q| at which distortion is 0.5.")
    mk_significance: float = Field(0.05, gt=0.0, lt=1.0, description="MK trend test level.")
    min_dwell_evals: int = Field(3, ge=0, description="Evaluations before any stop is allowed.")
    td_var_floor: float = Field(0.0, ge=0.0, description="'TD variance very low' rule; 0 = off.")
    stop_cost_max: float = Field(1.0, ge=0.0, le=1.0, description="Stop only when cost <= this.")
    cost_weights: CostWeights = Field(default_factory=CostWeights)


class EvaluationConfig(_Section):
    """The learning curve: greedy episodes every so many env steps (0 = only for early stop)."""

    every_env_steps: int = Field(5000, ge=0)
    episodes: int = Field(10, ge=1, le=1000)
    target_return: float | None = Field(
        None, description="Record when the greedy mean first reaches it."
    )
    stop_at_target: bool = Field(False, description="Stop training once target_return is reached.")


class DistributedConfig(_Section):
    """Ape-X on Ray. `actors_per_gpu` is the actor count per device (CPU counts as one)."""

    actors_per_gpu: int = Field(4, ge=1, le=1024)
    learners: int = Field(1, ge=1, le=1, description="Only one learner is implemented.")
    param_sync_interval: int = Field(1000, ge=1, description="Learner updates between broadcasts.")
    replay_shards: int = Field(4, ge=1, le=256)
    actor_chunk_steps: int = Field(64, ge=1, description="Env steps an actor sends per batch.")
    actor_num_envs: int = Field(1, ge=1, le=1024)
    epsilon_base: float = Field(0.4, gt=0.0, le=1.0, description="eps_i = base^(1+exp*i/(N-1)).")
    epsilon_exponent: float = Field(7.0, ge=0.0)
    actor_num_cpus: float = Field(0.5, ge=0.0, description="Ray scheduling CPUs per actor.")
    shard_num_cpus: float = Field(0.25, ge=0.0, description="Ray scheduling CPUs per shard.")
    ray_address: str | None = Field(None, description="Existing cluster ('auto' or host:port).")
    max_pending_samples: int = Field(2, ge=1, description="Prefetched sample requests.")
    batches_per_request: int = Field(4, ge=1, le=1024, description="Batches per shard round trip.")


class AGMConfigEntity(_Section):
    """The whole trainer configuration (immutable, versioned, validated on construction)."""

    schema_version: int = Field(SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    env_id: str = Field("CartPole-v1", description="Gymnasium env id (discrete actions).")
    num_envs: int = Field(8, ge=1, le=4096, description="Vectorised envs for collection.")
    total_steps: int = Field(50_000, ge=1, description="Env steps budget.")
    seed: int = Field(0, ge=0, description="Seed of the envs, the network and the replay.")
    torch_threads: int | None = Field(1, ge=1, description="torch threads; null = torch default.")
    log_every_updates: int = Field(100, ge=1)
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    optimiser: OptimiserConfig = Field(default_factory=OptimiserConfig)
    dqn: DQNConfig = Field(default_factory=DQNConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    kernel_smoothing: KernelSmoothingConfig = Field(default_factory=KernelSmoothingConfig)
    early_stopping: EarlyStoppingConfig = Field(
        default_factory=lambda: EarlyStoppingConfig(enabled=False)
    )
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    def with_overrides(self, **changes: Any) -> AGMConfigEntity:
        """A validated copy with dotted-key overrides, e.g. `{"replay.alpha": 0.5}`."""
        data = self.model_dump()
        for dotted, value in changes.items():
            parts = dotted.replace("__", ".").split(".")
            node = data
            for part in parts[:-1]:
                if part not in node or not isinstance(node[part], dict):
                    raise OffPolicyConfigError(f"unknown config section '{part}' in '{dotted}'")
                node = node[part]
            if parts[-1] not in node:
                raise OffPolicyConfigError(f"unknown config key '{dotted}'")
            node[parts[-1]] = value
        return build_config(data)


def _allowed_range(loc: tuple[Any, ...]) -> str | None:
    """The full allowed interval of the field at `loc`, e.g. '(0, 1]', from its constraints."""
    model: Any = AGMConfigEntity
    info = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        info = fields[part]
        model = info.annotation
    if info is None:
        return None
    lo, lo_open, hi, hi_open = "-inf", True, "inf", True
    for meta in info.metadata:
        for attr, is_low, is_open in (("gt", 1, 1), ("ge", 1, 0), ("lt", 0, 1), ("le", 0, 0)):
            value = getattr(meta, attr, None)
            if value is None:
                continue
            if is_low:
                lo, lo_open = f"{value:g}", bool(is_open)
            else:
                hi, hi_open = f"{value:g}", bool(is_open)
    if lo == "-inf" and hi == "inf":
        return None
    return f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(root)"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; configs/cartpole.yaml lists every key)"
        allowed = _allowed_range(loc)
        if allowed and err["type"] in (
            "greater_than",
            "greater_than_equal",
            "less_than",
            "less_than_equal",
        ):
            msg = f"out of range, allowed {allowed}"
        got = (
            f" (got {err['input']!r})"
            if "input" in err and not isinstance(err["input"], dict)
            else ""
        )
        lines.append(f"  {key}: {msg}{got}")
    where = f" {source}" if source else ""
    return f"invalid off-policy config{where}:\n" + "\n".join(lines)


def build_config(data: dict[str, Any] | None = None, source: str = "") -> AGMConfigEntity:
    """Validate a plain mapping into `AGMConfigEntity`, raising `OffPolicyConfigError`."""
    try:
        return AGMConfigEntity.model_validate(data or {})
    except ValidationError as exc:
        raise OffPolicyConfigError(_format_errors(exc, source)) from None


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-3` / `5e4` (no dot) as floats, as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_config(path: str | Path, **overrides: Any) -> AGMConfigEntity:
    """Read a YAML config file (see configs/cartpole.yaml) into a validated entity."""
    path = Path(path)
    if not path.is_file():
        raise OffPolicyConfigError(f"config file {path} not found; try configs/cartpole.yaml")
    data = yaml.load(path.read_text(), Loader=_Loader)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise OffPolicyConfigError(f"{path}: the top level must be a mapping of sections")
    cfg = build_config(data, source=str(path))
    return cfg.with_overrides(**overrides) if overrides else cfg
