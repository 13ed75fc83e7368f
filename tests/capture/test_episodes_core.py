"""The pure episode book: bounds (count, bytes, turns), idle expiry, versions, branches."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from agentrl.capture.episodes import MIXED, EpisodeBook, outcome_of, scope_key, to_trajectory

AT = datetime(2026, 1, 1, tzinfo=UTC)


def call(i: int) -> dict[str, Any]:
    fn = {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    return {"content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": fn}]}


def run(book: EpisodeBook, key: str, turns: int, model: str = "v1", now: float = 0.0) -> list[Any]:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "task " + key}]
    closed = []
    for i in range(turns):
        ans = call(i)
        closed += book.observe(key, msgs, ans, f"cid-{key}-{i}", model, now=now, at=AT)
        msgs = [
            *msgs,
            {"role": "assistant", **ans},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "3"},
        ]
    return closed


def test_open_episodes_are_capped_in_count_oldest_closed_first_and_counted() -> None:
    book = EpisodeBook(max_open=3)
    closed = []
    for k in "abcde":
        closed += run(book, k, 2)
        assert len(book.open) <= 3
    assert list(book.open) == ["c", "d", "e"]
    assert [c.episode.key for c in closed] == ["a", "b"] and book.counts.closed_memory == 2


def test_open_episodes_are_capped_in_bytes() -> None:
    book = EpisodeBook(max_open=1000, max_bytes=4000)
    closed = []
    for k in range(20):
        closed += run(book, f"s{k}", 3)
        assert book.bytes <= 4000 or len(book.open) == 1
    assert [c.reason for c in closed] == ["memory"] * len(closed) and len(closed) >= 10
    assert book.counts.closed_memory == len(closed)
    assert book.bytes == sum(e.size for e in book.open.values())
    # least recently active go first: touching an old episode keeps it
    book2 = EpisodeBook(max_open=2)
    run(book2, "x", 1)
    run(book2, "y", 1)
    run(book2, "x", 1)  # x is active again
    run(book2, "z", 1)
    assert set(book2.open) == {"x", "z"}


def test_memory_holds_new_messages_only() -> None:
    book = EpisodeBook()
    run(book, "long", 50)
    ep = book.open["long"]
    # the task, then only each tool result: the history is not stored again (not quadratic)
    assert [len(x.new_messages) for x in ep.exchanges] == [1] * 50


def test_idle_expiry_and_turn_cap() -> None:
    book = EpisodeBook(max_turns=3)
    run(book, "a", 5, now=0.0)
    run(book, "b", 1, now=50.0)
    closed = book.expire(now=60.0, idle_s=30.0)
    assert [c.episode.key for c in closed] == ["a"] and closed[0].reason == "idle"
    traj = to_trajectory(closed[0].episode, ended_at=AT, reason="idle")
    assert traj is not None and len(traj.turns) == 3
    assert traj.metadata.model_extra["capture"]["truncated"] is True
    assert book.counts.turns_dropped == 2


def test_an_episode_served_by_two_versions_names_both_and_claims_none() -> None:
    book = EpisodeBook()
    run(book, "hop", 1, model="v1")
    msgs = [
        {"role": "user", "content": "task hop"},
        {"role": "assistant", **call(0)},
        {"role": "tool", "tool_call_id": "c0", "content": "3"},
    ]
    book.observe("hop", msgs, {"content": "3"}, "cid-2", "v2", now=0, at=AT)
    ep = book.end("hop")
    assert ep is not None
    traj = to_trajectory(ep, ended_at=AT, reason="ended")
    assert traj is not None
    assert traj.metadata.model == MIXED  # the canary monitor leaves "unknown" out
    assert traj.metadata.model_extra["serving_versions"] == ["v1", "v2"]
    assert [t.action.model_extra["model"] for t in traj.turns] == ["v1", "v2"]
    assert traj.turns[0].result is not None and traj.turns[0].result.output == "3"


def test_a_new_branch_of_the_conversation_is_read_from_its_last_assistant_message() -> None:
    book = EpisodeBook()
    run(book, "br", 2)
    sub = [{"role": "system", "content": "sub-agent"}, {"role": "user", "content": "sub task"}]
    book.observe("br", sub, {"content": "done"}, "cid-sub", "v1", now=0, at=AT)
    ep = book.end("br")
    assert ep is not None
    traj = to_trajectory(ep, ended_at=AT, reason="ended")
    assert traj is not None and traj.turns[-1].observation.content == "sub task"


def test_outcomes() -> None:
    assert outcome_of(None, None) is None
    o = outcome_of(True, None)
    assert o is not None and o.task_status == "completed_successfully"
    o = outcome_of(False, None)
    assert o is not None and o.task_status == "failed" and o.completion_percentage == 0.0
    o = outcome_of(None, 0.4)
    assert o is not None and o.task_status == "partial_completion"


def test_another_conversation_under_a_key_is_a_linked_thread_of_the_same_episode() -> None:
    book = EpisodeBook()
    run(book, "u", 2)
    # a retry of the first request with the same task, and another task: threads, no close
    book.observe(
        "u", [{"role": "user", "content": "task u"}], {"content": "x"}, "r", "v1", now=0, at=AT
    )
    closed = book.observe(
        "u",
        [{"role": "user", "content": "another task"}],
        {"content": "y"},
        "n",
        "v1",
        now=0,
        at=AT,
    )
    assert closed == [] and len(book.open) == 1
    ep = book.open[scope_key(None, "u")]
    assert [t.task for t in ep.threads] == ["task u", "task u", "another task"]
    assert [t.parent for t in ep.threads] == [None, 1, 2]
    traj = to_trajectory(ep, ended_at=AT, reason="ended")
    assert traj is not None and [t.thread for t in traj.turns] == [1, 1, 2, 3]
    assert traj.metadata.threads is not None and len(traj.metadata.threads) == 3
    assert traj.task_context.instructions == "task u"


def test_the_canary_monitor_leaves_a_mixed_version_episode_out() -> None:
    from agentrl.release.monitor import RewardTracker

    book = EpisodeBook()
    run(book, "m", 1, model="v1")
    msgs = [{"role": "user", "content": "task m"}, {"role": "assistant", **call(0)}]
    book.observe("m", msgs, {"content": "3"}, "cid-m", "v2", now=0, at=AT)
    mixed = to_trajectory(book.open.pop("m"), ended_at=AT, reason="ended")
    run(book, "one", 1, model="v1")
    single = to_trajectory(book.open.pop("one"), ended_at=AT, reason="ended")
    assert mixed is not None and single is not None
    tracker = RewardTracker()
    tracker.on_trajectory(mixed)
    tracker.on_trajectory(single)
    assert tracker.trajectory_model[single.trajectory_id] == "v1"
    assert tracker.trajectory_model[mixed.trajectory_id] is None  # credited to no version


def test_capture_is_off_per_deployment_by_setting(monkeypatch: Any) -> None:
    from agentrl.release.service import _capture

    assert _capture(object()) is not None
    monkeypatch.setenv("AGENTRL_CAPTURE_ENABLED", "false")
    assert _capture(object()) is None
