"""`Event.model_validate_json`'s fast path returns exactly what pydantic's full schema returns:
the same model, fields set, extras, DeprecationWarnings and errors, for clean payloads and for
every input the skipped before-validators rewrite."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from agentrl.bench.bus import sample_trajectory
from agentrl.contracts import RewardEvent, TrajectoryEvent, base
from agentrl.contracts.base import Event


def _trajectory(**changes: Any) -> dict[str, Any]:
    wire: dict[str, Any] = sample_trajectory(3).to_wire()
    wire.update(changes)
    return wire


def _reward(**changes: Any) -> dict[str, Any]:
    wire: dict[str, Any] = {
        "reward_id": "9b2f0c1e-4c1a-4d8e-9a53-1d6f3b1a2c3d",
        "trajectory_id": "traj-1",
        "session_id": "s-1",
        "timestamp": "2026-11-23T05:00:00Z",
        "reward_components": {"task_completion": {"score": 1.0, "weight": 0.4}},
        "total_reward": 0.4,
    }
    wire.update(changes)
    return wire


def _fields(node: Any) -> Any:
    """Everything that distinguishes two validated models: values, fields set, extras."""
    if isinstance(node, BaseModel):
        return (
            type(node).__name__,
            {k: _fields(v) for k, v in node.__dict__.items()},
            sorted(node.model_fields_set),
            _fields(node.__pydantic_extra__),
        )
    if isinstance(node, dict):
        return {k: _fields(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_fields(v) for v in node]
    return node


def _run(call: Any) -> tuple[Any, list[str], Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, errors = call(), None
        except ValidationError as exc:
            # ctx holds the raised exception object itself, which compares by identity
            result, errors = None, exc.errors(include_url=False, include_context=False)
    return _fields(result), [str(w.message) for w in caught], errors


def _trajectory_cases() -> list[dict[str, Any]]:
    moved = _trajectory(outcome={"task_status": "completed_successfully"})
    moved["metadata"].pop("outcome", None)
    null_content = _trajectory()
    null_content["turns"][0]["observation"]["content"] = None
    null_model = _trajectory()
    null_model["metadata"]["model"] = None
    bad_turn = _trajectory()
    bad_turn["turns"][1]["turn_id"] = 0
    return [
        _trajectory(),
        moved,
        _trajectory(stray_field={"a": 1}),
        null_content,
        null_model,
        bad_turn,
        _trajectory(end_timestamp="2020-01-01T00:00:00Z"),
        _trajectory(turns=[]),
    ]


def _reward_cases() -> list[dict[str, Any]]:
    return [
        _reward(),
        _reward(reward_components={"x": {"score": 1.0, "weight": 1.0, "source": "implicit"}}),
        _reward(normalization=None, metadata=None),
        _reward(version=2, supersedes="r-0"),
        _reward(total_reward="high"),
    ]


@pytest.mark.parametrize(
    ("model", "payload"),
    [(TrajectoryEvent, p) for p in _trajectory_cases()]
    + [(RewardEvent, p) for p in _reward_cases()],
)
def test_fast_path_matches_full_schema(model: type[Event], payload: dict[str, Any]) -> None:
    raw = json.dumps(payload).encode()
    fast = _run(lambda: model.model_validate_json(raw))
    full = _run(lambda: model.__pydantic_validator__.validate_json(raw))
    assert fast == full


def test_clean_payload_takes_the_fast_path_and_round_trips() -> None:
    event = sample_trajectory(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = TrajectoryEvent.model_validate_json(event.to_json())
    assert again == event and again.to_json() == event.to_json()
    assert base._FAST[TrajectoryEvent][1] is not None  # the fast validator was built


def test_events_with_unmarked_input_validators_keep_the_full_schema() -> None:
    from agentrl.contracts import TrainingRequest, TrainingStatus

    assert RewardEvent._build_fast() is not None
    # TrainingConfig (grpo + adv_estimator gigpo -> gigpo) and StatusError (UNKNOWN +
    # detail_code) rewrite *valid* input: those events keep the full schema
    assert TrainingRequest._build_fast() is None
    assert TrainingStatus._build_fast() is None


def _deployed(**model_info: Any) -> dict[str, Any]:
    return {
        "deployment_id": "4c9f1b2e-8d7a-4e3b-9c1d-2a3b4c5d6e7f",
        "training_job_id": "job-1",
        "timestamp": "2026-11-23T05:00:00Z",
        "model_info": {
            "model_id": "m-1",
            "base_model": "smollm2",
            "checkpoint_path": "/ckpt/1",
            **model_info,
        },
        "deployment_config": {"endpoint": "http://127.0.0.1:8700/v1", "model_name": "p"},
        "validation_results": {
            "benchmark_passed": True,
            "safety_checks_passed": True,
            "performance_regression": False,
        },
    }


@pytest.mark.parametrize(
    "payload",
    [
        _deployed(),
        _deployed(training_samples=0),  # the marked validator's rewrite: full schema
        _deployed(training_samples=5, final_reward=0.5),
        _deployed(training_samples=-1),
        {**_deployed(), "stray": 1},
    ],
)
def test_deployment_events_take_the_fast_path_with_the_same_result(
    payload: dict[str, Any],
) -> None:
    from agentrl.contracts.deployment import ModelDeployed

    assert ModelDeployed._build_fast() is not None
    raw = json.dumps(payload).encode()
    fast = _run(lambda: ModelDeployed.model_validate_json(raw))
    full = _run(lambda: ModelDeployed.__pydantic_validator__.validate_json(raw))
    assert fast == full


def test_null_observation_content_reads_as_empty_in_python_mode_too() -> None:
    payload = _trajectory()
    payload["turns"][0]["observation"]["content"] = None
    assert TrajectoryEvent.model_validate(payload).turns[0].observation.content == ""


@pytest.mark.parametrize("payload", [_trajectory(), _reward()])
def test_to_json_is_model_dump_json(payload: dict[str, Any]) -> None:
    model = TrajectoryEvent if "turns" in payload else RewardEvent
    event = model.model_validate(payload)
    assert event.to_json() == event.model_dump_json(by_alias=True, exclude_none=True).encode()
