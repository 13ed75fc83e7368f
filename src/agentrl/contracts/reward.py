"""`agent.rl.reward.v1`: the reward computed for one trajectory (seed 000, section 2).

agentrl's additions travel in the open nested objects the published schema has: both totals
and which one `total_reward` is in `normalization`; the reward's version (late feedback yields
version + 1; consumers keep the highest), the calculator version, per-turn rewards and the
superseded reward id in `metadata`. The old top-level placements are still accepted on input
(with a DeprecationWarning) and readable as properties of `RewardEvent`.

A component's `source` goes out as one of the schema's values; agentrl's finer kinds
(`default`, `implicit`, `custom`, ...) are kept in the component's `source_kind`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from agentrl.contracts.base import (
    Event,
    Finite,
    Id,
    NonNegative,
    Part,
    Score01,
    Timestamp,
    new_id,
    noop_when_valid,
)

COMPONENT_SOURCES = ("automated", "human", "linter", "test_results", "benchmark")
# agentrl's finer kinds -> the schema's value ("implicit" is the user's behaviour: human)
SOURCE_OF_KIND = {"default": "automated", "implicit": "human", "custom": "automated"}
EVALUATION_METHODS = ("automated", "human", "hybrid", "model-based")


class RewardComponent(Part):
    score: Finite
    weight: NonNegative
    source: Literal["automated", "human", "linter", "test_results", "benchmark"] = "automated"
    reasoning: str | None = None

    @model_validator(mode="before")
    @classmethod
    @noop_when_valid  # a source outside the Literal fails it
    def _schema_source(cls, data: Any) -> Any:
        if isinstance(data, dict):
            source = data.get("source")
            if isinstance(source, str) and source not in COMPONENT_SOURCES:
                data = {
                    **data,
                    "source": SOURCE_OF_KIND.get(source, "automated"),
                    "source_kind": data.get("source_kind") or source,
                }
        return data


class Normalization(Part):
    method: Literal["z-score", "min-max", "none"] = "none"
    mean: Finite | None = None
    std: NonNegative | None = None
    # agentrl's additions (were top-level)
    raw_total_reward: Finite | None = None
    normalized_total_reward: Finite | None = None
    total_reward_kind: Literal["raw", "normalized"] = "raw"


class RewardMetadata(Part):
    evaluator: str = "agentrl-reward-service"
    evaluation_method: Literal["automated", "human", "hybrid", "model-based"] = "automated"
    confidence: Score01 | None = None
    # agentrl's additions (were top-level)
    version: int = Field(1, ge=1)
    calculator_version: str | None = None
    step_rewards: dict[str, Any] | None = None
    supersedes: str | None = None


class RewardEvent(Event):
    SUBJECT: ClassVar[str] = "agent.rl.reward.v1"
    ID_FIELD: ClassVar[str | None] = "reward_id"
    MOVED: ClassVar[dict[str, tuple[str, str]]] = {
        "raw_total_reward": ("normalization", "raw_total_reward"),
        "normalized_total_reward": ("normalization", "normalized_total_reward"),
        "total_reward_kind": ("normalization", "total_reward_kind"),
        "version": ("metadata", "version"),
        "calculator_version": ("metadata", "calculator_version"),
        "step_rewards": ("metadata", "step_rewards"),
        "supersedes": ("metadata", "supersedes"),
    }

    reward_id: Id = Field(default_factory=new_id)
    trajectory_id: Id
    session_id: Id
    timestamp: Timestamp
    reward_components: dict[str, RewardComponent]
    total_reward: Finite
    reward_type: Literal["dense", "sparse"] = "sparse"
    normalization: Normalization = Field(default_factory=Normalization)
    metadata: RewardMetadata = Field(default_factory=RewardMetadata)

    @model_validator(mode="before")
    @classmethod
    @noop_when_valid  # null fails the block models
    def _no_null_blocks(cls, data: Any) -> Any:
        # `normalization: null` / `metadata: null` were valid once: they mean "defaults"
        if isinstance(data, dict) and (
            ("normalization" in data and data["normalization"] is None)
            or ("metadata" in data and data["metadata"] is None)
        ):
            data = {
                k: v
                for k, v in data.items()
                if not (k in ("normalization", "metadata") and v is None)
            }
        return data

    @property
    def raw_total_reward(self) -> float | None:
        return self.normalization.raw_total_reward

    @property
    def normalized_total_reward(self) -> float | None:
        return self.normalization.normalized_total_reward

    @property
    def total_reward_kind(self) -> str:
        return self.normalization.total_reward_kind

    @property
    def version(self) -> int:
        return self.metadata.version

    @property
    def calculator_version(self) -> str | None:
        return self.metadata.calculator_version

    @property
    def step_rewards(self) -> dict[str, Any] | None:
        return self.metadata.step_rewards

    @property
    def supersedes(self) -> str | None:
        return self.metadata.supersedes
