"""Building and reading training requests (`agent.rl.training.request.v1`).

A trigger or a user may give a partial request; `fill_request` completes it with the
service's defaults (TrainingSettings) and validates it through the contract model, so every
request on the wire is the seed's full payload. Two job kinds share one lifecycle: a request
whose `training_config` carries an `environment` block (env_id, iterations, ...) trains
online in that environment; every other request trains on the logged trajectories.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from agentrl.contracts.base import new_id, utcnow
from agentrl.contracts.training import TrainingRequest
from agentrl.training.settings import TrainingSettings


def defaults(settings: TrainingSettings) -> dict[str, Any]:
    """The full request a trigger publishes when nothing else is said."""
    hp: dict[str, Any] = {
        "learning_rate": settings.learning_rate,
        "batch_size": settings.batch_size,
        "epochs": settings.epochs,
    }
    if settings.advantage_estimator:
        hp["adv_estimator"] = settings.advantage_estimator
    hp.update(settings.hyperparameters)
    dataset: dict[str, Any] = {"source": "nats_stream", "stream_name": "RL_TRAJECTORIES"}
    if settings.sample_size:
        dataset["sample_size"] = settings.sample_size
    if settings.min_reward is not None:
        dataset["filter"] = {"min_reward": settings.min_reward}
    if settings.dataset_window_s:
        now = utcnow()
        window = {"start": (now - timedelta(seconds=settings.dataset_window_s)).isoformat()}
        window["end"] = now.isoformat()
        dataset.setdefault("filter", {})["date_range"] = window
    extra: dict[str, Any] = {}
    if settings.init_from and settings.init_from != "base":
        extra["init_from"] = settings.init_from
    return {
        "training_job_id": new_id(),
        "timestamp": utcnow().isoformat(),
        "requester": "agentrl-training-service",
        "trigger_reason": "manual",
        "training_config": {
            "algorithm": settings.algorithm,
            "base_model": settings.base_model,
            "dataset": dataset,
            "hyperparameters": hp,
            "compute": {
                "gpu_count": 0,
                "distributed": False,
                "mixed_precision": settings.mixed_precision,
            },
            "checkpointing": {"save_interval": settings.save_interval, "max_checkpoints": 5},
            **extra,
        },
        "evaluation": {"enabled": True, "holdout_size": settings.holdout_size},
        "priority": "normal",
        "metadata": {"requested_by": "system"},
    }


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: nested objects merge key by key, everything else replaces."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def fill_request(partial: dict[str, Any], settings: TrainingSettings) -> TrainingRequest:
    """A validated full request from a partial one (raises pydantic.ValidationError)."""
    return TrainingRequest.model_validate(merge(defaults(settings), partial))


def job_kind(request: TrainingRequest) -> str:
    extra = request.training_config.model_extra or {}
    return "environment" if extra.get("environment") else "dataset"


def estimator(request: TrainingRequest) -> str:
    """The advantage estimator: GiGPO travels as algorithm 'grpo' with
    `hyperparameters.adv_estimator = 'gigpo'` (the contract reads it back as 'gigpo')."""
    algo = str(request.training_config.algorithm)
    hp = request.training_config.hyperparameters
    named = getattr(hp, "adv_estimator", None) or (hp.model_extra or {}).get("adv_estimator")
    if algo == "gigpo" or (algo == "grpo" and named == "gigpo"):
        return "gigpo"
    return algo
