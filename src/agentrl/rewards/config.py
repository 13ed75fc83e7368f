"""The reward configuration (YAML): weights, windows, custom functions, privacy.

Example `rewards.yaml`:

    weights: {task_completion: 0.4, efficiency: 0.2, code_quality: 0.15, user_feedback: 0.25}
    window: 1000                 # trailing window of the z-score normalisation
    total_reward: raw            # which total `total_reward` carries: raw | normalized
    custom_functions:
      - name: mentions_answer    # a @reward_function registered by ...
        module: my_rewards       # ... importing this module
        weight: 0.1
    opt_out_users: [user-123]
    opt_out_sessions: []
    partial_credit:              # tool use: credit per turn for what went right (off if absent)
      weights: {tool_call_valid: 1, tool_call_ran: 1, needed_value: 2, answer_given: 2, answer_right: 1}
      cap: 0.5                   # the most a failed trajectory earns (< 1, the success reward)

The calculator version (part of every reward id) includes a hash of the settings that change
scores, so two differently configured services never claim the same reward id.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.core.errors import ConfigError
from agentrl.rewards.code import DEFAULT_CODE_TOOLS, DEFAULT_LINT_IGNORE, DEFAULT_LINT_RULES
from agentrl.rewards.components import BUILTIN, PARTIAL
from agentrl.rewards.redact import KINDS

CALCULATOR = "agentrl-rewards-1"
DEFAULT_WEIGHTS = {
    "task_completion": 0.4,
    "efficiency": 0.2,
    "code_quality": 0.15,
    "user_feedback": 0.25,
}


class CustomFunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    weight: float = Field(0.1, ge=0.0)
    module: str | None = Field(
        None, description="Module to import (registers the function), or 'module:function'."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Passed to the function.")
    timeout_s: float = Field(5.0, gt=0)


# answer_given weighs as much as the needed value, so a failure that gave an answer (a
# wrong one, even with no call) earns at least as much as calls that never end in one
# unless those found the needed value. With answer_given 1 a call that ran and never
# answered (0.5 x 2/6 = 0.167) beat a wrong answer (0.5 x 1/4 = 0.125): a group's advantages
# then pushed away from answering, and without an answer no task can succeed.
DEFAULT_PARTIAL_WEIGHTS = {
    "tool_call_valid": 1.0,
    "tool_call_ran": 1.0,
    "needed_value": 2.0,
    "answer_given": 2.0,
    "answer_right": 1.0,
}


class PartialCreditConfig(BaseModel):
    """Partial credit per turn for tool-calling agents (components.partial_credit).

    P = sum(w_c x s_c) / sum(w_c) over the components that apply is the fraction of the
    checklist a trajectory ticked; a trajectory that did not succeed adds `cap` x gain x P
    to its total, gain = what succeeding would add to it (task completion's share), a
    success adds nothing (its success reward already counts it). So with `cap` below 1 no
    amount of partial credit lifts a failure to the same trajectory succeeded."""

    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_PARTIAL_WEIGHTS))
    cap: float = Field(0.5, ge=0.0, lt=1.0, description="The most a failure earns; < 1.")

    @field_validator("weights")
    @classmethod
    def _known(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = set(v) - set(PARTIAL)
        if unknown:
            raise ValueError(f"unknown partial-credit components {sorted(unknown)}; use {PARTIAL}")
        for name, w in v.items():
            if not w >= 0:
                raise ValueError(f"weight of {name!r} must be >= 0, got {w}")
        return {**DEFAULT_PARTIAL_WEIGHTS, **{k: float(w) for k, w in v.items()}}


class RewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    window: int = Field(1000, ge=1, description="Trailing window of the normalisation.")
    efficiency_window: int = Field(
        1000, ge=1, description="Trailing window of turn counts per domain."
    )
    efficiency_min_history: int = Field(
        5, ge=1, description="Earlier trajectories a domain needs before efficiency is scored."
    )
    efficiency_by_completion: bool = Field(
        True,
        description="Seed correction: efficiency x completion (1 done, pct partial, 0 failed); "
        "False gives the seed's formula (a short failure earns efficiency).",
    )
    total_reward: Literal["raw", "normalized"] = "raw"
    custom_functions: list[CustomFunctionSpec] = Field(default_factory=list)
    redact: bool = True
    pii_kinds: list[str] = Field(default_factory=lambda: list(KINDS))
    opt_out_users: list[str] = Field(default_factory=list)
    opt_out_sessions: list[str] = Field(default_factory=list)
    code_tools: list[str] = Field(default_factory=lambda: list(DEFAULT_CODE_TOOLS))
    lint_rules: list[str] = Field(default_factory=lambda: list(DEFAULT_LINT_RULES))
    lint_ignore: list[str] = Field(default_factory=lambda: list(DEFAULT_LINT_IGNORE))
    partial_credit: PartialCreditConfig | None = Field(
        None, description="Partial credit per turn for tool use (off when not given)."
    )
    max_turns: int = Field(
        1000, ge=1, description="Longer trajectories are dead-lettered, not scored."
    )
    evaluator: str = "agentrl-reward-service"
    retention_days: float = Field(
        30.0, gt=0, description="How long scored rewards are kept for late feedback."
    )

    @field_validator("weights")
    @classmethod
    def _weights_ok(cls, v: dict[str, float]) -> dict[str, float]:
        for name, w in v.items():
            if not w >= 0:
                raise ValueError(f"weight of {name!r} must be >= 0, got {w}")
        return v

    @field_validator("pii_kinds")
    @classmethod
    def _kinds_ok(cls, v: list[str]) -> list[str]:
        unknown = set(v) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown PII kinds {sorted(unknown)}; choose from {list(KINDS)}")
        return v

    @model_validator(mode="after")
    def _names_unique(self) -> RewardConfig:
        names = [f.name for f in self.custom_functions]
        reserved = set(BUILTIN) | (set(PARTIAL) if self.partial_credit is not None else set())
        clash = (set(names) & reserved) | {n for n in names if names.count(n) > 1}
        if clash:
            raise ValueError(
                f"custom reward function names must be unique and not built-in: {sorted(clash)}"
            )
        return self

    @classmethod
    def load(cls, path: str | Path | None) -> RewardConfig:
        """Read a YAML (or JSON) file; None gives the defaults."""
        if path is None:
            return cls()
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read reward config {p}: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValueError as exc:
            raise ConfigError(f"invalid reward config {p}: {exc}") from exc

    def component_weights(self) -> dict[str, float]:
        """Weights of every component, built-in and custom (custom weights from their spec)."""
        out = {name: float(self.weights.get(name, 0.0)) for name in BUILTIN}
        for spec in self.custom_functions:
            out[spec.name] = float(self.weights.get(spec.name, spec.weight))
        return out

    @property
    def calculator_version(self) -> str:
        scoring = self.model_dump(
            include={
                "weights",
                "window",
                "efficiency_window",
                "efficiency_min_history",
                "efficiency_by_completion",
                "total_reward",
                "custom_functions",
                "code_tools",
                "lint_rules",
                "lint_ignore",
            }
        )
        if self.partial_credit is not None:  # only then: other configs keep their ids
            scoring["partial_credit"] = self.partial_credit.model_dump()
        digest = hashlib.sha256(
            json.dumps(scoring, sort_keys=True, default=str).encode()
        ).hexdigest()[:8]
        return f"{CALCULATOR}+{digest}"
