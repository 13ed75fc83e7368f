"""Every analytics query against hand-built data with known answers (real chdb)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentrl.contracts.deployment import ModelDeployed
from agentrl.contracts.training import TrainingStatus
from agentrl.warehouse import samples as S
from agentrl.warehouse.queries import Analytics, run_named

from .conftest import store

FAIL = [("code_exe", False, 100.0)]
OK = [("search", True, 10.0), ("code_exe", True, 20.0)]


def _status(job: str, status: str, minute: int, step: int, **extra: object) -> TrainingStatus:
    payload: dict[str, object] = {
        "training_job_id": job,
        "timestamp": (S.BASE + timedelta(minutes=minute)).isoformat(),
        "status": status,
        "progress": {"current_step": step, "total_steps": 10},
        **extra,
    }
    return TrainingStatus.model_validate(payload)


def _deployed(dep: str, model_id: str, minute: int, pct: float) -> ModelDeployed:
    return ModelDeployed.model_validate(
        {
            "deployment_id": dep,
            "training_job_id": "job-a",
            "timestamp": (S.BASE + timedelta(minutes=minute)).isoformat(),
            "model_info": {"model_id": model_id, "base_model": "tiny", "checkpoint_path": "/c"},
            "deployment_config": {
                "endpoint": "http://x/v1",
                "model_name": "agentrl-policy",
                "traffic_percentage": pct,
            },
            "validation_results": {
                "benchmark_passed": True,
                "safety_checks_passed": True,
                "performance_regression": False,
            },
        }
    )


@pytest.fixture()
def filled(backend, wsettings):  # type: ignore[no-untyped-def]
    """m-1/coding: trajectories 0-3, m-2/research: 4-6 (6 unrewarded); 0 has a v2 reward."""
    hour = timedelta(hours=1)
    events = [
        S.trajectory(0, tools=OK),
        S.trajectory(1, tools=OK),
        S.trajectory(2, tools=OK, start=S.BASE + hour),
        S.trajectory(3, tools=FAIL, status="failed", start=S.BASE + hour),
        S.trajectory(4, model="m-2", domain="research", tools=OK),
        S.trajectory(5, model="m-2", domain="research", tools=FAIL, status="failed"),
        S.trajectory(6, model="m-2", domain="research", tools=OK + FAIL, status="failed"),
        S.reward(0, 0.2),
        S.reward(0, 1.0, version=2),
        S.reward(1, 0.4),
        S.reward(2, 0.6),
        S.reward(3, 0.8),
        S.reward(4, 0.1, model="m-2"),
        S.reward(5, 0.3, model="m-2"),
        S.feedback(0, "thumbs_up"),
        S.feedback(1, "thumbs_down"),
        S.feedback(2, "rating", rating=4),
        S.feedback(3, "rating", rating=2),
        _status("job-a", "queued", 0, 0),
        _status("job-a", "running", 1, 5),
        _status(
            "job-a", "completed", 2, 10, artifacts={"final_checkpoint": "/ck", "base_model": "tiny"}
        ),
        _status("job-b", "queued", 3, 0),
        _status("job-b", "failed", 4, 0, error={"code": "DATA", "message": "empty"}),
        _deployed("d-1", "v1", 5, 10.0),
        _deployed("d-2", "v1", 6, 100.0),
    ]
    assert store(backend, wsettings.database, events) == {}
    assert store(backend, wsettings.database, events) == {}  # every event redelivered once
    return Analytics(backend, wsettings.database)


def test_counts_collapse_redeliveries(filled: Analytics) -> None:
    assert filled.counts() == {
        "trajectories": 7,
        "turns": 4 * 3 + 2 * 2 + 1 * 4,  # tool turns + a final response per trajectory
        "rewards": 7,
        "feedback": 4,
        "training_jobs": 5,
        "deployments": 2,
        "model_versions": 1,
    }


def test_reward_distribution_uses_latest_version(filled: Analytics) -> None:
    rows = {(r["model"], r["domain"]): r for r in filled.reward_distribution()}
    assert set(rows) == {("m-1", "coding"), ("m-2", "research")}
    a, b = rows["m-1", "coding"], rows["m-2", "research"]
    assert a["trajectories"] == 4 and a["mean"] == pytest.approx(0.7)
    assert a["min"] == pytest.approx(0.4) and a["max"] == pytest.approx(1.0)
    assert a["p50"] in (pytest.approx(0.6), pytest.approx(0.8))
    assert b["trajectories"] == 2 and b["mean"] == pytest.approx(0.2)
    assert b["std"] == pytest.approx(0.1)


def test_success_over_time_per_model_and_bucket(filled: Analytics) -> None:
    rows = filled.success_over_time(bucket_s=3600)
    got = [(r["model"], r["trajectories"], r["success_rate"], r["mean_reward"]) for r in rows]
    assert got == [
        ("m-1", 2, pytest.approx(1.0), pytest.approx(0.7)),  # 1.0 and 0.4
        ("m-2", 3, pytest.approx(1 / 3), pytest.approx(0.2)),
        ("m-1", 2, pytest.approx(0.5), pytest.approx(0.7)),  # 0.6 and 0.8
    ]
    only = filled.success_over_time(bucket_s=86400, model="m-2")
    assert [(r["trajectories"], r["rewarded"]) for r in only] == [(3, 2)]
    later = filled.success_over_time(since=S.BASE + timedelta(minutes=30))
    assert [r["trajectories"] for r in later] == [2]


def test_length_histogram(filled: Analytics) -> None:
    assert filled.length_histogram() == [
        {"turns": 2, "trajectories": 2},
        {"turns": 3, "trajectories": 4},
        {"turns": 4, "trajectories": 1},
    ]
    assert filled.length_histogram(model="m-2") == [
        {"turns": 2, "trajectories": 1},
        {"turns": 3, "trajectories": 1},
        {"turns": 4, "trajectories": 1},
    ]


def test_slowest_and_failing_tools(filled: Analytics) -> None:
    slow = filled.tools(order="slowest")
    assert [r["tool"] for r in slow] == ["code_exe", "search"]
    code = slow[0]
    # code_exe: 4 ok calls of 20 ms (0,1,2,4 + 6) = 5 ok, 3 failed of 100 ms (3,5,6)
    assert (code["calls"], code["failures"]) == (8, 3)
    assert code["mean_ms"] == pytest.approx((5 * 20 + 3 * 100) / 8)
    assert code["p95_ms"] == pytest.approx(100.0)
    failing = filled.tools(order="failing", limit=1)
    assert [(r["tool"], r["failures"]) for r in failing] == [("code_exe", 3)]
    assert run_named(filled, "failing-tools", limit=5)[1]["failures"] == 0


def test_feedback_counts(filled: Analytics) -> None:
    rows = {r["type"]: r for r in filled.feedback_counts()}
    assert {k: v["count"] for k, v in rows.items()} == {
        "rating": 2,
        "thumbs_down": 1,
        "thumbs_up": 1,
    }
    assert rows["rating"]["mean_rating"] == pytest.approx(3.0)
    assert rows["thumbs_up"]["mean_rating"] is None


def test_training_and_deployment_timelines(filled: Analytics) -> None:
    jobs = filled.training_timeline()
    assert [(j["training_job_id"], j["status"], j["events"]) for j in jobs] == [
        ("job-a", "completed", 3),
        ("job-b", "failed", 2),
    ]
    assert jobs[0]["final_checkpoint"] == "/ck" and jobs[0]["base_model"] == "tiny"
    assert jobs[0]["steps"] == 10 and jobs[1]["error_code"] == "DATA"
    deps = filled.deployments_timeline()
    assert [(d["deployment_id"], d["traffic_percentage"]) for d in deps] == [
        ("d-1", 10.0),
        ("d-2", 100.0),
    ]
    models = filled.model_versions()
    assert len(models) == 1 and models[0]["traffic_percentage"] == 100.0


def test_parameters_with_awkward_text(backend, wsettings) -> None:  # type: ignore[no-untyped-def]
    """Tabs, quotes and backslashes in filter values reach the engine intact (chdb reads
    parameters as escaped text; lists as array literals)."""
    from agentrl.contracts.training import DatasetFilter
    from agentrl.warehouse.export import select_dataset

    odd = "m\t'x\\y\n"
    assert (
        store(
            backend, wsettings.database, [S.trajectory(0, model=odd, profile=odd), S.reward(0, 0.5)]
        )
        == {}
    )
    a = Analytics(backend, wsettings.database)
    assert [r["trajectories"] for r in a.success_over_time(model=odd)] == [1]
    assert a.length_histogram(model=odd) == [{"turns": 3, "trajectories": 1}]
    kept = select_dataset(
        backend, wsettings.database, DatasetFilter(exclude_subordinate_profiles=["other"])
    )
    gone = select_dataset(
        backend, wsettings.database, DatasetFilter(exclude_subordinate_profiles=[odd])
    )
    assert (kept.num_rows, gone.num_rows) == (1, 0)
