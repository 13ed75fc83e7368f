"""Rewards: the seed's four components, normalisation, custom reward functions, PII redaction
and the reward service (seed 000, "Reward Computation Strategy").

The numerical core (`components`, `window`, `calculator`) is pure; `service` composes it with
the bus. Import what you need from here:

    from agentrl.rewards import reward_function, EvaluateResult, MetricResult, StepOutput
    from agentrl.rewards import score_trajectory, RewardConfig
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.rewards.calculator import ScoringInput, reward_id, score_batch, score_trajectory
    from agentrl.rewards.config import RewardConfig
    from agentrl.rewards.custom import (
        EvaluateResult,
        MetricResult,
        RewardFunction,
        StepOutput,
        reward_function,
    )
    from agentrl.rewards.redact import Redactor, redact_payload

# Each name from its module on first use: a command that only reads the reward options
# (`agentrl --help` among them) does not load the scoring core and numpy.
_WHERE = {
    "ScoringInput": "calculator",
    "reward_id": "calculator",
    "score_batch": "calculator",
    "score_trajectory": "calculator",
    "RewardConfig": "config",
    "EvaluateResult": "custom",
    "MetricResult": "custom",
    "RewardFunction": "custom",
    "StepOutput": "custom",
    "reward_function": "custom",
    "Redactor": "redact",
    "redact_payload": "redact",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "EvaluateResult",
    "MetricResult",
    "Redactor",
    "RewardConfig",
    "RewardFunction",
    "ScoringInput",
    "StepOutput",
    "redact_payload",
    "reward_function",
    "reward_id",
    "score_batch",
    "score_trajectory",
]
