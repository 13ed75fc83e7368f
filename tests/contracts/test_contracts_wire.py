"""Wire compatibility with PMOVES.AI's published agent-rl schemas, for every event as every
producer builds it: no null anywhere, the seed's top-level fields only, canonical UUID ids,
every enum value PMOVES allows accepted, only allowed values emitted, and the old top-level
placements still accepted (with a DeprecationWarning).

The rules are written here from the schemas' text (read at PMOVES.AI commit 09f0ad7,
pmoves/contracts/schemas/agent-rl/*.v1.schema.json); no file of theirs is copied. Set
AGENTRL_PMOVES_SCHEMAS to a folder holding their five schema files to also validate against
them (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import uuid
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agentrl.contracts import (
    MODELS,
    ModelDeployed,
    RewardEvent,
    TrainingRequest,
    TrainingStatus,
    TrajectoryEvent,
)
from agentrl.contracts.base import without_nulls
from agentrl.contracts.schemas import wire_schema
from agentrl.envs import make_env, task_for
from agentrl.rewards.calculator import ScoringInput, score_batch
from agentrl.rewards.config import RewardConfig
from agentrl.rewards.window import WindowState
from agentrl.rollout import run_group
from agentrl.rollout.convert import episode_to_trajectory
from agentrl.rollout.policies import ScriptedPolicy

DATA = Path(__file__).parent / "data"
NOW = datetime(2026, 11, 23, 4, 0, tzinfo=UTC)

# The seed's top-level fields per subject (its example payloads name every one of them).
SEED_KEYS = {
    subject: set(json.loads((DATA / f"seed_{subject}.json").read_text()))
    for subject in (
        "agent.rl.trajectory.v1",
        "agent.rl.reward.v1",
        "agent.rl.training.request.v1",
        "agent.rl.training.status.v1",
        "agent.rl.model.deployed.v1",
    )
}
REQUIRED = {
    "agent.rl.trajectory.v1": {
        "trajectory_id", "session_id", "agent_id", "start_timestamp", "end_timestamp",
        "turns", "task_context", "metadata",
    },
    "agent.rl.reward.v1": {
        "reward_id", "trajectory_id", "session_id", "timestamp", "reward_components",
        "total_reward", "reward_type", "metadata",
    },
    "agent.rl.training.request.v1": {
        "training_job_id", "timestamp", "requester", "trigger_reason", "training_config",
    },
    "agent.rl.training.status.v1": {"training_job_id", "timestamp", "status"},
    "agent.rl.model.deployed.v1": {
        "deployment_id", "training_job_id", "timestamp", "model_info", "deployment_config",
        "validation_results",
    },
}  # fmt: skip
UUID_KEYS = {
    "agent.rl.trajectory.v1": ["trajectory_id"],
    "agent.rl.reward.v1": ["reward_id", "trajectory_id"],
    "agent.rl.training.request.v1": ["training_job_id"],
    "agent.rl.training.status.v1": ["training_job_id"],
    "agent.rl.model.deployed.v1": ["deployment_id", "training_job_id"],
}


# -- the producers, as they build events ------------------------------------------------------


async def rollout_trajectory() -> TrajectoryEvent:
    task = task_for("sokoban", seed=8)
    env = make_env("sokoban")
    env.reset(task.seed)
    plan = env.optimal_plan()  # type: ignore[attr-defined]
    policy = ScriptedPolicy(per_episode=[plan], action_format="text")
    (episode,) = await run_group(task, 1, policy, env_factory=make_env, max_episode_steps=len(plan))
    return episode_to_trajectory(episode, model="tiny", subordinate_profile="developer")


def reward_wire(trajectory: TrajectoryEvent) -> bytes:
    """The bytes the reward service publishes (the calculator's payload, not re-encoded)."""
    cfg = RewardConfig()
    scored, _ = score_batch([ScoringInput(trajectory)], WindowState(cfg.window), cfg)
    return scored[0].to_json()


def training_events() -> list[TrainingRequest | TrainingStatus]:
    """A request as the training service's triggers fill it, and its status events as the
    service builds them (a running job without its total steps known, then a failure)."""
    from types import SimpleNamespace

    from agentrl.training.requests import fill_request
    from agentrl.training.service import TrainingService
    from agentrl.training.settings import TrainingSettings

    settings = TrainingSettings(algorithm="grpo", mixed_precision="no")
    request = fill_request(
        {"training_config": {"hyperparameters": {"adv_estimator": "gigpo"}}}, settings
    )
    job_id = request.training_job_id
    service = SimpleNamespace(  # what build_status reads of a service: no stored job here
        name="runner-1", job_leases={}, _torch_version=None, store=SimpleNamespace(get=dict().get)
    )
    metrics = {"current": {"loss": 0.4, "reward_mean": 0.2, "reward_std": 0.1}}

    def status(state: str, **kw: Any) -> TrainingStatus:
        return TrainingService.build_status(service, job_id, state, **kw)  # type: ignore[arg-type]

    return [
        request,
        status("running", final={"progress": {"current_epoch": 0, "current_step": 0}}),
        status(
            "running",
            final={"progress": {"current_step": 1, "total_steps": 3}, "metrics": metrics},
        ),
        status("failed", error={"code": "CONFIG", "message": "x"}),
    ]


def deployed_event() -> ModelDeployed:
    return ModelDeployed.model_validate(
        {
            "training_job_id": str(uuid.uuid4()),
            "timestamp": NOW,
            "model_info": {"model_id": "m-v2", "base_model": "tiny", "checkpoint_path": "/c"},
            "deployment_config": {
                "serving_platform": "vllm",
                "endpoint": "http://127.0.0.1:8700/v1/chat/completions",
                "model_name": "agentrl-policy",
            },
            "validation_results": {
                "benchmark_passed": True,
                "safety_checks_passed": True,
                "performance_regression": False,
            },
        }
    )


@pytest.fixture(scope="module")
def wire() -> list[tuple[str, dict[str, Any]]]:
    """(subject, decoded wire payload) for every event every producer builds."""
    import asyncio

    trajectory = asyncio.run(rollout_trajectory())
    out = [(TrajectoryEvent.SUBJECT, json.loads(trajectory.to_json()))]
    out.append((RewardEvent.SUBJECT, json.loads(reward_wire(trajectory))))
    out += [(e.SUBJECT, json.loads(e.to_json())) for e in training_events()]
    out.append((ModelDeployed.SUBJECT, json.loads(deployed_event().to_json())))
    for name in sorted(p.stem.split("_", 1)[1] for p in DATA.glob("seed_*.json")):
        model = MODELS[name]
        out.append(
            (
                name,
                json.loads(
                    model.model_validate_json((DATA / f"seed_{name}.json").read_text()).to_json()
                ),
            )
        )
    return out


def nulls(value: Any, where: str = "") -> list[str]:
    if value is None:
        return [where or "<root>"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in nulls(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in nulls(v, f"{where}[{i}]")]
    return []


# -- the rules --------------------------------------------------------------------------------


def test_no_null_anywhere_on_the_wire(wire: list[tuple[str, dict[str, Any]]]) -> None:
    for subject, payload in wire:
        assert nulls(payload) == [], subject


def test_top_level_is_the_seeds_fields_only(wire: list[tuple[str, dict[str, Any]]]) -> None:
    subjects = set()
    for subject, payload in wire:
        subjects.add(subject)
        assert set(payload) <= SEED_KEYS[subject], (subject, set(payload) - SEED_KEYS[subject])
        assert REQUIRED[subject] <= set(payload), (subject, REQUIRED[subject] - set(payload))
    assert subjects == set(SEED_KEYS)


def test_producers_fill_the_seeds_top_level(wire: list[tuple[str, dict[str, Any]]]) -> None:
    """The rollout trajectory and the calculator's reward carry every seed field."""
    trajectory, reward = wire[0][1], wire[1][1]
    assert set(trajectory) == SEED_KEYS[TrajectoryEvent.SUBJECT]
    assert set(reward) == SEED_KEYS[RewardEvent.SUBJECT]


def test_producer_ids_are_canonical_uuids(wire: list[tuple[str, dict[str, Any]]]) -> None:
    for subject, payload in wire[:7]:  # the producers' events (not the seed's examples)
        for key in UUID_KEYS[subject]:
            assert str(uuid.UUID(payload[key])) == payload[key], (subject, key)


def test_emitted_values_are_the_schemas(wire: list[tuple[str, dict[str, Any]]]) -> None:
    by = {}
    for subject, payload in wire[:7]:
        by.setdefault(subject, []).append(payload)
    for payload in by[RewardEvent.SUBJECT]:
        for comp in payload["reward_components"].values():
            assert comp["source"] in ("automated", "human", "linter", "test_results", "benchmark")
            assert 0 <= comp["weight"] <= 1
        assert payload["metadata"]["evaluation_method"] in (
            "automated",
            "human",
            "hybrid",
            "model-based",
        )
        assert payload["normalization"]["method"] in ("z-score", "min-max", "none")
    # the default user_feedback component is agentrl's "default" kind: kept in source_kind
    uf = by[RewardEvent.SUBJECT][0]["reward_components"]["user_feedback"]
    assert (uf["source"], uf["source_kind"]) == ("automated", "default")
    request = by[TrainingRequest.SUBJECT][0]
    config = request["training_config"]
    assert config["algorithm"] == "grpo" and config["hyperparameters"]["adv_estimator"] == "gigpo"
    assert config["compute"]["mixed_precision"] == "fp32"
    assert config["dataset"]["sample_size"] >= 1
    statuses = by[TrainingStatus.SUBJECT]
    assert "total_steps" not in statuses[0]["progress"]  # unknown: absent, not 0
    assert statuses[-1]["error"] == {"code": "UNKNOWN", "detail_code": "CONFIG", "message": "x"}
    trajectory = by[TrajectoryEvent.SUBJECT][0]
    assert trajectory["turns"][0]["turn_id"] == 1
    assert all("result" in t for t in trajectory["turns"])
    assert trajectory["metadata"]["outcome"]["task_status"] == "completed_successfully"


def test_wire_validates_against_the_exported_schemas(
    wire: list[tuple[str, dict[str, Any]]],
) -> None:
    """`agentrl schemas export` describes exactly what goes out (formats asserted)."""
    import jsonschema  # here, not at the top: ~2.6 s of CPU in every collecting process

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for i, (subject, payload) in enumerate(wire):
        schema = wire_schema(MODELS[subject])
        jsonschema.Draft202012Validator.check_schema(schema)
        errors = [
            e.message
            for e in jsonschema.Draft202012Validator(schema, format_checker=checker).iter_errors(
                payload
            )
            # the seed's own examples (after the producers' 7) use ids like "job-123"
            if not (i >= 7 and e.validator == "format" and e.validator_value == "uuid")
        ]
        assert errors == [], subject
    bad = dict(wire[0][1], surprise=1)
    schema = wire_schema(TrajectoryEvent)
    assert schema["additionalProperties"] is False
    assert not jsonschema.Draft202012Validator(schema).is_valid(bad)


def test_exported_schemas_say_uuid_and_no_null() -> None:
    for subject, model in MODELS.items():
        text = json.dumps(wire_schema(model))
        assert '"type": "null"' not in text, subject
        assert '"gigpo"' not in text and '"CONFIG"' not in text, subject
        assert (
            wire_schema(model)["properties"][model.ID_FIELD or "training_job_id"]["format"]
            == "uuid"
        )


# -- input: every value PMOVES allows, the old placements -------------------------------------


def seed(subject: str) -> dict[str, Any]:
    return json.loads((DATA / f"seed_{subject}.json").read_text())


@pytest.mark.parametrize(
    ("subject", "path", "value"),
    [
        ("agent.rl.trajectory.v1", ("turns", 0, "observation", "type"), "system_message"),
        ("agent.rl.trajectory.v1", ("turns", 0, "action", "type"), "memory_update"),
        ("agent.rl.trajectory.v1", ("task_context", "domain"), "debugging"),
        ("agent.rl.trajectory.v1", ("task_context", "domain"), "writing"),
        ("agent.rl.training.request.v1", ("trigger_reason",), "performance_degradation"),
        ("agent.rl.training.request.v1", ("training_config", "algorithm"), "reinforce"),
        ("agent.rl.training.request.v1", ("training_config", "dataset", "source"), "s3"),
        ("agent.rl.training.request.v1", ("training_config", "dataset", "source"), "local"),
        ("agent.rl.training.request.v1", ("training_config", "compute", "mixed_precision"), "fp32"),
        ("agent.rl.training.request.v1", ("priority",), "urgent"),
        (
            "agent.rl.training.request.v1",
            ("training_config", "dataset", "filter", "task_domains"),
            ["debugging", "writing"],
        ),
        ("agent.rl.training.status.v1", ("error", "code"), "TIMEOUT"),
        ("agent.rl.training.status.v1", ("error", "code"), "UNKNOWN"),
        ("agent.rl.model.deployed.v1", ("metadata", "approval_status"), "emergency_override"),
    ],
)
def test_every_value_pmoves_allows_is_accepted_and_goes_out_unchanged(
    subject: str, path: tuple[Any, ...], value: Any
) -> None:
    payload = seed(subject)
    node: Any = payload
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    event = MODELS[subject].model_validate(payload)
    out: Any = json.loads(event.to_json())
    for key in path:
        out = out[key]
    assert out == value


def test_old_trajectory_outcome_placement_round_trips_with_a_warning() -> None:
    payload = seed("agent.rl.trajectory.v1")
    payload["outcome"] = {"task_status": "failed", "task_abandoned": True}
    with pytest.warns(DeprecationWarning, match="'outcome'.*metadata.outcome"):
        event = TrajectoryEvent.model_validate(payload)
    assert event.outcome is not None and event.outcome.task_abandoned
    out = json.loads(event.to_json())
    assert "outcome" not in out and out["metadata"]["outcome"]["task_status"] == "failed"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new placement reads back without a warning
        again = TrajectoryEvent.model_validate(out)
    assert again == event


def test_old_reward_placements_round_trip_with_a_warning() -> None:
    payload = seed("agent.rl.reward.v1")
    old = {
        "raw_total_reward": 0.86,
        "normalized_total_reward": 0.1,
        "total_reward_kind": "raw",
        "version": 3,
        "calculator_version": "calc-1",
        "step_rewards": {"per_step": [0.1, 0.2]},
        "supersedes": str(uuid.uuid4()),
    }
    payload.update(old)
    with pytest.warns(DeprecationWarning) as record:
        event = RewardEvent.model_validate(payload)
    assert len([w for w in record if "deprecated" in str(w.message)]) == len(old)
    for key, value in old.items():
        assert getattr(event, key) == value, key  # still readable where it was
    out = json.loads(event.to_json())
    assert set(out) == SEED_KEYS[RewardEvent.SUBJECT]
    assert out["normalization"]["raw_total_reward"] == 0.86
    assert out["normalization"]["method"] == "z-score"  # the seed's own block kept
    assert (
        out["metadata"]["version"] == 3 and out["metadata"]["evaluator"] == "rl-trainer-subordinate"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RewardEvent.model_validate(out) == event


def test_old_values_are_read_and_written_as_the_schemas() -> None:
    payload = seed("agent.rl.training.request.v1")
    config = payload["training_config"]
    config["algorithm"] = "gigpo"  # input shorthand
    config["compute"]["mixed_precision"] = "no"
    config["dataset"]["source"] = "file"
    config["dataset"]["sample_size"] = None
    with pytest.warns(DeprecationWarning, match="'file'"):
        event = TrainingRequest.model_validate(payload)
    assert event.training_config.algorithm == "gigpo"  # agentrl's code reads its own names
    assert event.training_config.compute.mixed_precision == "no"
    out = json.loads(event.to_json())["training_config"]
    assert out["algorithm"] == "grpo" and out["hyperparameters"]["adv_estimator"] == "gigpo"
    assert out["compute"]["mixed_precision"] == "fp32"
    assert out["dataset"]["source"] == "local" and out["dataset"]["sample_size"] == 10_000
    back = TrainingRequest.model_validate_json(event.to_json())
    assert back == event  # grpo + adv_estimator gigpo reads back as gigpo


def test_status_zero_totals_and_agentrl_error_codes() -> None:
    payload = seed("agent.rl.training.status.v1")
    payload["progress"].update(total_epochs=0, total_steps=0)
    payload["error"]["code"] = "CANCELLED"
    event = TrainingStatus.model_validate(payload)
    out = json.loads(event.to_json())
    assert "total_epochs" not in out["progress"] and "total_steps" not in out["progress"]
    assert out["error"]["code"] == "UNKNOWN" and out["error"]["detail_code"] == "CANCELLED"
    assert TrainingStatus.model_validate(out).error.code == "CANCELLED"  # type: ignore[union-attr]


def test_component_sources_outside_the_schema_keep_their_kind() -> None:
    payload = seed("agent.rl.reward.v1")
    payload["reward_components"]["user_feedback"]["source"] = "implicit"
    payload["reward_components"]["custom_fn"] = {"score": 1.0, "weight": 0.1, "source": "custom"}
    out = json.loads(RewardEvent.model_validate(payload).to_json())["reward_components"]
    assert (out["user_feedback"]["source"], out["user_feedback"]["source_kind"]) == (
        "human",
        "implicit",
    )
    assert (out["custom_fn"]["source"], out["custom_fn"]["source_kind"]) == ("automated", "custom")


def test_without_nulls_for_plain_dict_producers() -> None:
    assert without_nulls({"a": None, "b": {"c": None, "d": [1, {"e": None}]}}) == {
        "b": {"d": [1, {}]}
    }


# -- against PMOVES.AI's own files, when a checkout is at hand ---------------------------------

PMOVES = os.environ.get("AGENTRL_PMOVES_SCHEMAS")


@pytest.mark.skipif(
    not PMOVES, reason="set AGENTRL_PMOVES_SCHEMAS to PMOVES.AI's schemas/agent-rl folder"
)
def test_against_pmoves_published_schemas(wire: list[tuple[str, dict[str, Any]]]) -> None:
    import jsonschema

    folder = Path(str(PMOVES))
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for subject, payload in wire[:7]:
        name = subject.removeprefix("agent.rl.").removesuffix(".v1")
        schema = json.loads((folder / f"{name}.v1.schema.json").read_text())
        errors = [
            e
            for e in jsonschema.Draft202012Validator(schema, format_checker=checker).iter_errors(
                payload
            )
            # their `exclusiveMinimum: true` (draft-4 spelling) reads as "> 1" in 2020-12
            if not (e.validator == "exclusiveMinimum" and e.validator_value is True)
        ]
        assert [f"{list(e.absolute_path)}: {e.message}" for e in errors] == [], subject
