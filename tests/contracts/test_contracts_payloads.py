"""The seed's payloads validate, round-trip, and bad payloads fail naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from agentrl.contracts import MODELS, STREAMS, model_for, stream_for
from agentrl.contracts.feedback import FeedbackEvent
from agentrl.contracts.schemas import export_schemas
from agentrl.contracts.training import TrainingStatus
from agentrl.contracts.trajectory import TrajectoryEvent

DATA = Path(__file__).parent / "data"
EXAMPLES = sorted(DATA.glob("*.json"))


def subject_of(path: Path) -> str:
    return path.stem.split("_", 1)[1]


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_seed_examples_validate_and_round_trip(path: Path) -> None:
    model = model_for(subject_of(path))
    assert model is not None
    event = model.model_validate_json(path.read_text())
    again = model.model_validate_json(event.to_json())
    assert again == event
    # every field the seed wrote survives the round trip (a null goes out as absent)
    original = json.loads(path.read_text())
    dumped = json.loads(again.to_json())
    assert_subset(original, dumped)


def assert_subset(original: object, dumped: object, where: str = "") -> None:
    if isinstance(original, dict):
        assert isinstance(dumped, dict), where
        for key, value in original.items():
            if value is None:
                assert dumped.get(key) is None, f"{where}.{key}"
                continue
            assert key in dumped, f"{where}.{key} lost"
            assert_subset(value, dumped[key], f"{where}.{key}")
    elif isinstance(original, list):
        assert isinstance(dumped, list) and len(dumped) == len(original), where
        for i, (a, b) in enumerate(zip(original, dumped, strict=True)):
            assert_subset(a, b, f"{where}[{i}]")
    elif isinstance(original, str) and original.endswith("Z") and "T" in original:
        assert dumped in (original, original[:-1] + "+00:00"), where
    else:
        assert dumped == original, where


def test_appendix_examples_validate_as_written() -> None:
    reward = model_for("agent.rl.reward.v1").model_validate(  # type: ignore[union-attr]
        load("appendix_agent.rl.reward.v1.json")
    )
    assert reward.reward_id == "test-123" and reward.trajectory_id == "traj-456"
    assert reward.total_reward == pytest.approx(0.92)
    req = model_for("agent.rl.training.request.v1").model_validate(  # type: ignore[union-attr]
        load("appendix_agent.rl.training.request.v1.json")
    )
    assert req.training_config.algorithm == "ppo"
    assert req.training_config.hyperparameters.clip_epsilon == 0.2  # default filled in


def errors_of(model: type, payload: dict) -> list[str]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(payload)
    return [".".join(str(p) for p in e["loc"]) for e in info.value.errors()]


def test_bad_enum_names_the_field() -> None:
    payload = load("seed_agent.rl.trajectory.v1.json")
    payload["turns"][0]["observation"]["type"] = "telepathy"
    assert "turns.0.observation.type" in errors_of(TrajectoryEvent, payload)


def test_typed_fields_are_strict() -> None:
    payload = load("seed_agent.rl.trajectory.v1.json")
    payload["metadata"]["total_tokens"] = "5000"
    assert "metadata.total_tokens" in errors_of(TrajectoryEvent, payload)


def test_naive_timestamp_rejected() -> None:
    payload = load("seed_agent.rl.trajectory.v1.json")
    payload["start_timestamp"] = "2025-12-08T12:00:00"
    assert "start_timestamp" in errors_of(TrajectoryEvent, payload)


def test_empty_id_rejected_and_missing_id_generated() -> None:
    payload = load("seed_agent.rl.trajectory.v1.json")
    payload["trajectory_id"] = ""
    assert "trajectory_id" in errors_of(TrajectoryEvent, payload)
    del payload["trajectory_id"]
    event = TrajectoryEvent.model_validate(payload)
    assert len(event.trajectory_id) == 36 and event.msg_id() == event.trajectory_id


def test_unknown_fields_are_kept() -> None:
    """Nested objects are open; an unknown top-level field is folded into `metadata` (the
    published schemas allow no extra top-level field) so nothing is lost."""
    payload = load("seed_agent.rl.trajectory.v1.json")
    payload["new_top_level"] = {"x": 1}
    payload["turns"][0]["action"]["confidence"] = 0.4
    with pytest.warns(DeprecationWarning, match="new_top_level"):
        event = TrajectoryEvent.model_validate(payload)
    dumped = json.loads(event.to_json())
    assert "new_top_level" not in dumped
    assert dumped["metadata"]["new_top_level"] == {"x": 1}
    assert dumped["turns"][0]["action"]["confidence"] == 0.4


def test_end_before_start_rejected() -> None:
    payload = load("seed_agent.rl.trajectory.v1.json")
    payload["end_timestamp"] = "2025-12-08T11:00:00Z"
    with pytest.raises(ValidationError, match="end_timestamp is before start_timestamp"):
        TrajectoryEvent.model_validate(payload)


def test_failed_status_needs_error_and_status_dedupes_by_content() -> None:
    payload = load("seed_agent.rl.training.status.v1.json")
    payload["status"] = "failed"
    payload.pop("error")
    with pytest.raises(ValidationError, match="needs an error block"):
        TrainingStatus.model_validate(payload)
    a = TrainingStatus.model_validate(load("seed_agent.rl.training.status.v1.json"))
    b = TrainingStatus.model_validate(load("seed_agent.rl.training.status.v1.json"))
    assert a.msg_id() == b.msg_id()


def test_feedback_rating_needs_value() -> None:
    base = {"trajectory_id": "t", "timestamp": "2025-12-08T12:00:00Z", "type": "rating"}
    with pytest.raises(ValidationError, match="rating"):
        FeedbackEvent.model_validate(base)
    assert FeedbackEvent.model_validate({**base, "rating": 4}).rating == 4
    assert "rating" in errors_of(FeedbackEvent, {**base, "rating": 6})


def test_every_subject_has_a_stream() -> None:
    for subject in MODELS:
        assert stream_for(subject).name.startswith("RL_")
    assert stream_for("agent.rl.model.deployed.v1").name == "RL_MODELS"
    assert stream_for("agent.rl.training.status.v1").name == "RL_TRAINING"
    assert stream_for("agent.rl.dlq.agent.rl.reward.v1").name == "RL_DLQ"
    assert stream_for("agent.rl.offpolicy.parameter_sync").name == "RL_OFFPOLICY"
    names = [s.name for s in STREAMS]
    assert len(names) == len(set(names))
    with pytest.raises(KeyError):
        stream_for("other.subject")


def test_seed_stream_limits() -> None:
    limits = {s.name: (s.max_age_s // 86400, s.max_msgs, s.storage) for s in STREAMS}
    assert limits["RL_TRAJECTORIES"] == (30, 1_000_000, "file")
    assert limits["RL_REWARDS"] == (30, 500_000, "file")
    assert limits["RL_TRAINING"] == (7, 10_000, "file")


def test_schema_export(tmp_path: Path) -> None:
    paths = export_schemas(tmp_path)
    assert {p.name for p in paths} == {f"{s}.json" for s in MODELS}
    schema = json.loads((tmp_path / "agent.rl.trajectory.v1.json").read_text())
    assert schema["$id"] == "agent.rl.trajectory.v1"
    assert "turns" in schema["required"]
