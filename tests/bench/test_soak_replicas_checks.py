"""The replicated soak's checks on hand-made data (the soak itself needs minutes and eight
service processes): decisions recorded twice, stuck jobs, jobs resumed on another runner,
when the drain after the run is over, and the last JSON line's keys."""

from __future__ import annotations

import json
from types import SimpleNamespace

from agentrl.bench.soak import SoakResult
from agentrl.bench.soak_replicas import (
    LAST_LINE_KEYS,
    Drain,
    JobHistory,
    duplicate_decisions,
    main_json,
)


def _d(action: str, step: int | None, dep: str = "d1") -> object:
    return SimpleNamespace(action=action, evidence={"step": step, "deployment_id": dep})


def test_a_decision_recorded_twice_is_found_and_holds_are_not_counted() -> None:
    once = SimpleNamespace(
        model_id="v1",
        decisions=[
            _d("set_weight", 0),
            _d("hold", 0),
            _d("hold", 0),  # holds repeat on a changed verdict: not a decision taken twice
            _d("advance", 0),
            _d("set_weight", 1),
            _d("promote", 1),
        ],
    )
    assert duplicate_decisions([once]) == []
    twice = SimpleNamespace(model_id="v2", decisions=[_d("advance", 0), _d("advance", 0)])
    again = SimpleNamespace(
        model_id="v3", decisions=[_d("advance", 0, "d1"), _d("advance", 0, "d2")]
    )
    assert duplicate_decisions([once, twice, again]) == [("v2", "advance", "d1", 0)]


def _status(job: str, status: str, runner: str | None = None) -> dict[str, object]:
    return {"training_job_id": job, "status": status, "metadata": {"runner": runner}}


def test_job_history_finds_stuck_jobs_and_jobs_resumed_elsewhere() -> None:
    events = [
        _status("a", "queued"),
        _status("a", "running", "replica-0"),
        _status("a", "running", "replica-0"),
        _status("a", "queued", "replica-1"),  # the resume
        _status("a", "running", "replica-1"),
        _status("a", "completed", "replica-1"),
        _status("b", "queued"),
        _status("b", "running", "replica-1"),
        _status("b", "failed", "replica-1"),
        _status("c", "queued"),
        _status("c", "running", "replica-0"),
        _status("d", "running", "replica-0"),
        _status("d", "running", "replica-1"),  # moved but never ended
    ]
    h = JobHistory.of(events)
    assert h.resumed_elsewhere() == ["a"]
    assert h.stuck() == ["c", "d"]
    # the status bucket is newer than the stream: c ended meanwhile
    assert h.stuck({"c": "completed"}) == ["d"]


def test_the_drain_waits_out_the_follow_up_job_a_threshold_fires_when_the_last_job_ends() -> None:
    """The soak at load 6.5: the drain looked between the last job's final status and the
    request of the follow-up job it fired (rewards counted while it ran), saw every
    consumer idle and no job, and ended; the check then found the follow-up running."""
    d = Drain(quiet_s=60.0, cap_s=180.0)
    assert d.look(0.0, [], {"a": "running"}, (10, 10, 50)) is None
    assert d.look(1.0, [], {"a": "running"}, (10, 10, 52)) is None  # a's progress
    # a completed; its follow-up's request is not out yet: idle, no job, but it just moved
    assert d.look(2.0, [], {}, (10, 10, 53)) is None
    assert d.look(3.0, ["training"], {}, (10, 10, 54)) is None  # the request
    assert d.look(4.0, [], {"b": "queued"}, (10, 10, 55)) is None
    for t in range(5, 40):
        assert d.look(float(t), [], {"b": "running"}, (10, 10, 55 + t)) is None
    assert d.look(40.0, [], {}, (10, 10, 96)) is None  # b completed
    assert d.look(42.0, [], {}, (10, 10, 96)) is None  # still only 2 s
    assert d.look(43.0, [], {}, (10, 10, 96)) == "caught up"
    assert d.waited_for == {"a": "ended", "b": "ended"}
    assert d.idle_then_more == 1  # the look at 2.0, where the old drain ended
    assert d.waited() == "job a (ended); job b (ended); consumers training"


def test_the_drain_calls_a_job_that_makes_no_progress_stuck_and_bounds_moving_work() -> None:
    d = Drain(quiet_s=30.0, cap_s=90.0)
    assert d.look(0.0, [], {"c": "running"}, (5, 5, 5)) is None
    assert d.look(29.0, [], {"c": "running"}, (5, 5, 5)) is None
    assert d.look(30.0, [], {"c": "running"}, (5, 5, 5)) == "stuck"
    assert d.waited() == "job c (running)"
    # a consumer that never catches up, nothing moving: stuck too
    d = Drain(quiet_s=30.0, cap_s=90.0)
    assert d.look(0.0, ["rewards"], {}, (5, 5, 5)) is None
    assert d.look(31.0, ["rewards"], {}, (5, 5, 5)) == "stuck"
    # work that keeps moving is waited for, up to the cap
    d = Drain(quiet_s=30.0, cap_s=90.0)
    verdicts = [d.look(float(t), [], {"e": "running"}, (1, 1, t)) for t in range(0, 91, 5)]
    assert verdicts[:-1] == [None] * (len(verdicts) - 1) and verdicts[-1] == "capped"


def test_the_last_line_names_the_issue_keys_first() -> None:
    r = SoakResult()
    r.checks["x"] = True
    r.figures.update(
        duplicate_rewards=0,
        missing_rewards=0,
        stuck_jobs=0,
        jobs_resumed_elsewhere=1,
        controller_failover_s=4.2,
        gateway_errors_total=3,
        lost=0,
        drain_s=1.0,
    )
    line = json.loads(main_json(r, 2))
    assert tuple(line)[: len(LAST_LINE_KEYS)] == LAST_LINE_KEYS
    assert line["ok"] is True and line["replicas"] == 2 and line["gateway_errors"] == 3
    assert line["drain_s"] == 1.0
    r.checks["y"] = False
    assert json.loads(main_json(r, 2))["ok"] is False
