"""The reward service against a real embedded nats-server (its own, for this module)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agentrl.bench.rewards import read_stream
from agentrl.bus import Bus, EmbeddedNats
from agentrl.contracts.feedback import FeedbackEvent
from agentrl.contracts.reward import RewardEvent
from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.subjects import FEEDBACK, REWARD, TRAJECTORY
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.rewards import RewardConfig, ScoringInput, reward_function, score_batch
from agentrl.rewards.custom import REGISTRY, EvaluateResult
from agentrl.rewards.service import RewardService
from agentrl.rewards.store import RewardStore
from agentrl.rewards.window import WindowState

STREAMS = ("RL_TRAJECTORIES", "RL_REWARDS", "RL_FEEDBACK", "RL_DLQ")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    srv = EmbeddedNats(data_dir=tmp_path_factory.mktemp("rewards-nats"))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture()
async def bus(server: EmbeddedNats) -> AsyncIterator[Bus]:
    b = await Bus.connect(server.url, name="rewards-test")
    await b.ensure_streams()
    for stream in STREAMS:
        await b.js.purge_stream(stream)
    yield b
    for svc in Running.started:
        if not svc.task.done():
            svc.task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(svc.task, 10)
    Running.started.clear()
    await asyncio.wait_for(b.close(), 10)


class Running:
    """A reward service running in this event loop until `stop()` (the `running` fixture
    stops whatever a failed test left running)."""

    started: ClassVar[list[Running]] = []

    def __init__(
        self,
        bus: Bus,
        data_dir: Path,
        config: RewardConfig | None = None,
        durable: str = "rewards",
        **kw: Any,
    ) -> None:
        self.service = RewardService(bus, config, data_dir, durable=durable, **kw)
        self._stop = asyncio.Event()
        self.task = asyncio.create_task(self.service.run(self._stop))
        Running.started.append(self)

    async def stop(self) -> None:
        self._stop.set()
        if not self.task.done():
            await asyncio.wait_for(self.task, 30)


_durables = iter(range(10**6))


def durable() -> str:
    return f"rewards-t{next(_durables)}-{time.monotonic_ns()}"


async def publish_trajectories(bus: Bus, docs: list[dict[str, Any]]) -> None:
    for k in range(0, len(docs), 500):
        await bus.publish_many([TrajectoryEvent.model_validate(d) for d in docs[k : k + 500]])


async def rewards(bus: Bus) -> list[dict[str, Any]]:
    return await read_stream(bus, "RL_REWARDS", REWARD)


async def wait_rewards(
    bus: Bus, trajectories: int, timeout: float = 60.0, versions: int = 1
) -> list[dict[str, Any]]:
    """Wait until the stream holds rewards for `trajectories` distinct trajectories (and
    `versions` total versions summed... i.e. at least that many messages)."""
    deadline = time.monotonic() + timeout
    while True:
        info = await bus.js.stream_info("RL_REWARDS")
        if info.state.messages >= trajectories * versions:
            docs = await rewards(bus)
            if len({d["trajectory_id"] for d in docs}) >= trajectories:
                return docs
        if time.monotonic() > deadline:
            docs = await rewards(bus)
            raise AssertionError(
                f"only {len(docs)} rewards after {timeout}s (wanted {trajectories})"
            )
        await asyncio.sleep(0.05)


def fresh(i: int, **kw: Any) -> dict[str, Any]:
    """A sample trajectory with a never-used id (JetStream remembers message ids for its
    duplicate window even across purges)."""
    return sample_trajectory(i, trajectory_id=str(uuid.uuid4()), **kw)


def docs_for(n: int, offset: int = 0, **kw: Any) -> list[dict[str, Any]]:
    return [fresh(offset + i, **kw) for i in range(n)]


# ---- exactly once ------------------------------------------------------------------------
async def test_thousand_trajectories_give_exactly_thousand_rewards(
    bus: Bus, tmp_path: Path
) -> None:
    docs = docs_for(1000)
    svc = Running(bus, tmp_path, durable=durable())
    await publish_trajectories(bus, docs)
    got = await wait_rewards(bus, 1000)
    await asyncio.sleep(0.3)
    await svc.stop()
    got = await rewards(bus)
    assert len(got) == 1000
    assert len({d["reward_id"] for d in got}) == 1000
    assert {d["trajectory_id"] for d in got} == {d["trajectory_id"] for d in docs}
    calc = RewardConfig().calculator_version
    from agentrl.rewards import reward_id

    for d in got:
        ev = RewardEvent.model_validate(d)  # every published reward honours the contract
        assert ev.reward_id == reward_id(ev.trajectory_id, calc, 1)
        assert ev.version == 1 and ev.calculator_version == calc
    stats = svc.service.stats()
    assert stats["trajectories_scored"] == 1000 and stats["dead_lettered"] == 0


async def test_restart_in_the_middle_loses_nothing_duplicates_nothing_keeps_statistics(
    bus: Bus, tmp_path: Path
) -> None:
    docs = docs_for(1000, offset=5000)
    name = durable()
    cfg = RewardConfig(
        window=5000
    )  # larger than the run: the window must hold each trajectory once
    first = Running(bus, tmp_path, cfg, durable=name, batch=64)
    await publish_trajectories(bus, docs[:500])
    await wait_rewards(bus, 300)
    await first.stop()
    scored_before = first.service.counters["trajectories_scored"]
    assert 300 <= scored_before <= 500
    await publish_trajectories(bus, docs[500:])  # while no service runs
    second = Running(bus, tmp_path, cfg, durable=name, batch=64)
    got = await wait_rewards(bus, 1000)
    await asyncio.sleep(0.3)
    await second.stop()
    got = await rewards(bus)
    assert len(got) == 1000 and len({d["reward_id"] for d in got}) == 1000
    assert second.service.counters["trajectories_scored"] == 1000  # counters persisted too
    state = RewardStore(tmp_path / "rewards" / "state.sqlite").load_windows(5000, 1000)
    assert len(state.components["task_completion"]) == 1000
    # The restart continued with the same statistics: identical to scoring in one go.
    by_tid = {d["trajectory_id"]: d for d in got}
    reference, _ = score_batch(
        [ScoringInput(TrajectoryEvent.model_validate(d)) for d in docs],
        WindowState(5000, 1000),
        cfg,
    )
    for ref in reference:
        mine = by_tid[ref.trajectory_id]
        assert mine["reward_id"] == ref.reward_id
        assert mine["normalization"]["normalized_total_reward"] == pytest.approx(
            ref.payload["normalization"]["normalized_total_reward"], abs=1e-9
        )
        assert mine["normalization"]["raw_total_reward"] == pytest.approx(
            ref.payload["normalization"]["raw_total_reward"], abs=1e-12
        )


async def test_redelivered_trajectory_is_acked_without_a_second_reward(
    bus: Bus, tmp_path: Path
) -> None:
    doc = fresh(42)
    svc = Running(bus, tmp_path, durable=durable())
    await publish_trajectories(bus, [doc])
    (first,) = await wait_rewards(bus, 1)
    # The same trajectory again under another message id (JetStream would drop the same id).
    await bus.publish_raw(TRAJECTORY, json.dumps(doc).encode(), "another-msg-id")
    deadline = time.monotonic() + 20
    while svc.service.counters["redelivered"] < 1:
        assert time.monotonic() < deadline, "the copy was never delivered"
        await asyncio.sleep(0.02)
    await svc.stop()
    got = await rewards(bus)
    assert len(got) == 1 and got[0]["reward_id"] == first["reward_id"]  # not published again
    assert svc.service.counters["trajectories_scored"] == 1


# ---- privacy -----------------------------------------------------------------------------
async def test_pii_never_reaches_rewards_state_or_custom_functions(
    bus: Bus, tmp_path: Path
) -> None:
    seen: list[str] = []

    @reward_function(name="peek")  # async: runs in this process, so `seen` fills up
    async def peek(
        messages: list[dict[str, Any]], ground_truth: Any = None, **kw: Any
    ) -> EvaluateResult:
        seen.append(json.dumps(messages))
        raise ValueError(f"echoing input: {messages[0]['content']}")

    docs = docs_for(20, offset=300, pii=True)
    docs[0]["turns"][0]["action"] = {
        "type": "tool_call",
        "tool_name": "http",
        "tool_args": {"password": "hunter2-very-secret", "card": "4111 1111 1111 1111"},
    }
    secrets = ["hunter2-very-secret", "4111 1111 1111 1111"]
    for i in range(len(docs)):
        secrets.append(f"jane.doe{300 + i}@example.com")
        secrets.append(f"415-555-{(300 + i) % 10000:04d}")
        secrets.append("sk-proj-")
    cfg = RewardConfig(custom_functions=[{"name": "peek", "weight": 0.1}])
    svc = Running(bus, tmp_path, cfg, durable=durable())
    await publish_trajectories(bus, docs)
    got = await wait_rewards(bus, 20)
    await svc.stop()
    REGISTRY.pop("peek", None)
    published = json.dumps(got)
    stored = b"".join(p.read_bytes() for p in (tmp_path / "rewards").iterdir())
    for secret in secrets:
        assert secret not in published
        assert secret.encode() not in stored
        assert all(secret not in s for s in seen)
    assert len(seen) == 20
    assert "[REDACTED:EMAIL]" in published  # the custom function's error quoted redacted text
    first = next(d for d in got if d["trajectory_id"] == docs[0]["trajectory_id"])
    assert first["metadata"]["redactions"] == {
        "email": 2,
        "phone": 2,
        "api_key": 1,
        "password": 1,
        "credit_card": 1,
    }
    assert svc.service.counters["trajectories_redacted"] == 20


async def test_opted_out_users_and_sessions_are_dropped_and_counted(
    bus: Bus, tmp_path: Path
) -> None:
    keep = docs_for(3, offset=700)
    flagged = fresh(710, opt_out=True)
    by_session = fresh(711, session_id="private-session")
    by_user = fresh(712, user_id="user-who-said-no")
    cfg = RewardConfig(opt_out_sessions=["private-session"], opt_out_users=["user-who-said-no"])
    svc = Running(bus, tmp_path, cfg, durable=durable())
    await publish_trajectories(bus, [*keep, flagged, by_session, by_user])
    await wait_rewards(bus, 3)
    late = FeedbackEvent(
        trajectory_id=flagged["trajectory_id"], timestamp="2025-12-08T12:10:00Z", type="thumbs_up"
    )  # type: ignore[arg-type]
    await bus.publish(late)
    await asyncio.sleep(1.0)
    await svc.stop()
    got = await rewards(bus)
    assert {d["trajectory_id"] for d in got} == {d["trajectory_id"] for d in keep}
    assert svc.service.counters["dropped_opt_out"] == 3
    assert svc.service.counters["feedback_dropped_opt_out"] == 1


# ---- feedback ----------------------------------------------------------------------------
async def test_late_feedback_yields_the_next_reward_version(bus: Bus, tmp_path: Path) -> None:
    doc = fresh(900, feedback="none", status="completed_successfully")
    early_doc = fresh(901, feedback="none", status="completed_successfully")
    svc = Running(bus, tmp_path, durable=durable())
    # Feedback that arrives before its trajectory waits and is folded into version 1.
    await bus.publish(
        FeedbackEvent(
            trajectory_id=early_doc["trajectory_id"],
            timestamp="2025-12-08T12:00:00Z",
            type="thumbs_down",
        )
    )  # type: ignore[arg-type]
    await asyncio.sleep(0.5)
    await publish_trajectories(bus, [doc, early_doc])
    got = await wait_rewards(bus, 2)
    v1 = {d["trajectory_id"]: d for d in got}
    assert v1[doc["trajectory_id"]]["reward_components"]["user_feedback"]["score"] == 0.5
    early = v1[early_doc["trajectory_id"]]
    assert (
        early["metadata"]["version"] == 1
        and early["reward_components"]["user_feedback"]["score"] == 0.0
    )
    assert len(early["metadata"]["feedback"]["feedback_ids"]) == 1

    fb = FeedbackEvent(
        trajectory_id=doc["trajectory_id"],
        timestamp="2025-12-08T12:10:00Z",
        type="rating",
        rating=4,
    )  # type: ignore[arg-type]
    await bus.publish(fb)
    got = await wait_rewards(bus, 2, versions=1)
    deadline = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        got = await rewards(bus)
    # The same feedback redelivered (another message id): no third version.
    await bus.publish_raw(FEEDBACK, fb.to_json(), "redelivered-feedback")
    await asyncio.sleep(1.0)
    await svc.stop()
    got = await rewards(bus)
    mine = sorted(
        (d for d in got if d["trajectory_id"] == doc["trajectory_id"]),
        key=lambda d: d["metadata"]["version"],
    )
    assert [d["metadata"]["version"] for d in mine] == [1, 2]
    v2 = RewardEvent.model_validate(mine[1])
    assert v2.reward_id != mine[0]["reward_id"]
    assert v2.supersedes == mine[0]["reward_id"]
    assert v2.reward_components["user_feedback"].score == pytest.approx(0.8)
    assert v2.reward_components["user_feedback"].source == "human"
    assert v2.reward_components["task_completion"].score == 1.0
    assert (
        v2.raw_total_reward is not None
        and v2.raw_total_reward > mine[0]["normalization"]["raw_total_reward"]
    )
    # consumers keep the highest version per trajectory
    latest = max(mine, key=lambda d: d["metadata"]["version"])
    assert latest["reward_id"] == v2.reward_id


# ---- bad input ---------------------------------------------------------------------------
async def test_bad_trajectories_are_dead_lettered_and_the_service_keeps_going(
    bus: Bus, tmp_path: Path
) -> None:
    cfg = RewardConfig(max_turns=12)
    svc = Running(bus, tmp_path, cfg, durable=durable())
    await bus.publish_raw(TRAJECTORY, b"{not json", "bad-json")
    missing = fresh(1)
    del missing["session_id"]
    await bus.publish_raw(TRAJECTORY, json.dumps(missing).encode(), "bad-schema")
    too_long = fresh(2, turns=13)
    await publish_trajectories(bus, [too_long])
    good = fresh(3)
    await publish_trajectories(bus, [good])
    got = await wait_rewards(bus, 1)
    deadline = time.monotonic() + 20
    dead: list[dict[str, Any]] = []
    while len(dead) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        dead = await bus.dead_letters()
    await svc.stop()
    assert [d["trajectory_id"] for d in got] == [good["trajectory_id"]]
    reasons = sorted(d["error"] for d in dead)
    assert len(dead) == 3
    assert any("payload failed validation" in r and "session_id" in r for r in reasons)
    assert any("payload failed validation" in r for r in reasons if "session_id" not in r)
    assert any("13 turns, more than max_turns=12" in r for r in reasons)
    assert svc.service.stats()["dead_lettered"] == 3


async def test_large_bad_messages_are_dead_lettered_and_the_service_keeps_going(
    bus: Bus, tmp_path: Path
) -> None:
    """Poison messages near the server's max_payload (their dead letters cannot carry them
    whole): the service stays up, dead-letters each, and scores the good one after them."""
    limit = bus.nc.max_payload
    svc = Running(bus, tmp_path, RewardConfig(max_turns=12), durable=durable())
    big_junk = b"{" + b"x" * int(limit * 0.9)
    await bus.publish_raw(TRAJECTORY, big_junk, "big-junk")
    too_long = fresh(4, turns=13)
    too_long["turns"][0]["observation"]["content"] = "y" * int(limit * 0.8)
    await bus.publish_raw(TRAJECTORY, json.dumps(too_long).encode(), "big-too-long")
    good = fresh(5)
    await publish_trajectories(bus, [good])
    got = await wait_rewards(bus, 1)
    deadline = time.monotonic() + 20
    while svc.service.stats()["dead_lettered"] < 2:
        assert not svc.task.done(), f"the service died: {svc.task.exception()!r}"
        assert time.monotonic() < deadline, "the big messages were not dead-lettered"
        await asyncio.sleep(0.05)
    assert not svc.task.done()
    await svc.stop()
    assert [d["trajectory_id"] for d in got] == [good["trajectory_id"]]
    info = await bus.js.consumer_info("RL_TRAJECTORIES", svc.service.durable)
    assert info.num_pending == 0 and info.num_ack_pending == 0  # nothing left to redeliver
    dead = await bus.dead_letters()
    assert len(dead) == 2


async def test_state_file_is_sqlite_with_rewards_and_windows(bus: Bus, tmp_path: Path) -> None:
    svc = Running(bus, tmp_path, durable=durable())
    await publish_trajectories(bus, docs_for(10, offset=1200))
    await wait_rewards(bus, 10)
    await svc.stop()
    db = sqlite3.connect(tmp_path / "rewards" / "state.sqlite")
    assert db.execute("SELECT COUNT(*) FROM rewards").fetchone()[0] == 10
    assert db.execute("SELECT COUNT(*) FROM kv WHERE key='windows'").fetchone()[0] == 1


async def test_rewards_left_in_the_outbox_are_published_at_start(bus: Bus, tmp_path: Path) -> None:
    # A crash after the commit and before JetStream confirmed the publish leaves the reward in
    # the outbox (the trajectory may already be acked): the next start publishes it.
    (scored,), _ = score_batch(
        [ScoringInput(TrajectoryEvent.model_validate(fresh(77)))], WindowState(), RewardConfig()
    )
    store = RewardStore(tmp_path / "rewards" / "state.sqlite")
    store.commit(
        rewards=[(scored.trajectory_id, 1, scored.to_json(), {})],
        outbox=[(scored.reward_id, scored.trajectory_id, scored.to_json())],
    )
    store.close()
    svc = Running(bus, tmp_path, durable=durable())
    (got,) = await wait_rewards(bus, 1)
    await svc.stop()
    assert got["reward_id"] == scored.reward_id
    assert svc.service.counters["outbox_replayed"] == 1
    assert RewardStore(tmp_path / "rewards" / "state.sqlite").outbox() == []


async def test_agentrl_up_entry_point_reads_rewards_yaml_from_the_data_dir(
    bus: Bus, tmp_path: Path
) -> None:
    from agentrl.core.settings import Settings
    from agentrl.rewards.service import serve

    (tmp_path / "rewards.yaml").write_text("total_reward: normalized\nwindow: 50\n")
    settings = Settings(data_dir=tmp_path)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, stop, settings))
    await publish_trajectories(bus, docs_for(3, offset=1500))
    got = await wait_rewards(bus, 3)
    stop.set()
    await asyncio.wait_for(task, 30)
    assert {d["normalization"]["total_reward_kind"] for d in got} == {"normalized"}
    assert {d["normalization"]["window"] for d in got} == {50}
    assert (tmp_path / "rewards" / "state.sqlite").exists()


# ---- partial credit and corrections ---------------------------------------------------------
async def test_partial_credit_and_a_users_correction_through_the_service(
    bus: Bus, tmp_path: Path
) -> None:
    """Tool-use trajectories scored by the running service with partial credit on: every
    component reported, per-turn rewards that sum to the total, a failure below the success;
    then a thumbs-down with a correction (PII inside) makes version 2, which carries the
    redacted correction and keeps the partial credit."""
    from tooluse_helpers import answer, call, garbled, trajectory

    from agentrl.rewards.config import PartialCreditConfig

    cfg = RewardConfig(
        weights={
            "task_completion": 1.0,
            "efficiency": 0.0,
            "code_quality": 0.0,
            "user_feedback": 0.0,
        },
        partial_credit=PartialCreditConfig(cap=0.5),
    )
    win = trajectory(
        [call("calculator", {"expression": "(418 - 37) * 26 + 905"}, "= 10811"), answer("10811")],
        status="completed_successfully",
        tid=str(uuid.uuid4()),
    )
    lose = trajectory(
        [
            garbled(),
            call("calculator", {"expression": "(418 - 37) * 26 + 905"}, "= 10811"),
            answer("10812", "not correct"),
        ],
        status="failed",
        tid=str(uuid.uuid4()),
    )
    svc = Running(bus, tmp_path, cfg, durable=durable())
    await bus.publish_many([win, lose])
    got = {d["trajectory_id"]: d for d in await wait_rewards(bus, 2)}
    w, f = got[win.trajectory_id], got[lose.trajectory_id]
    assert w["total_reward"] == pytest.approx(1.0)
    for name in (
        "tool_call_valid",
        "tool_call_ran",
        "needed_value",
        "answer_given",
        "answer_right",
    ):
        assert name in f["reward_components"], name
    assert f["reward_components"]["tool_call_valid"]["score"] == pytest.approx(0.5)
    assert 0.0 < f["total_reward"] < w["total_reward"]
    assert sum(f["metadata"]["turn_rewards"]) == pytest.approx(f["total_reward"])
    assert f["metadata"]["turn_rewards"][0] == 0.0  # the garbled reply earned nothing

    await bus.publish(
        FeedbackEvent(
            trajectory_id=lose.trajectory_id,
            timestamp="2026-01-01T00:05:00Z",
            type="thumbs_down",
            correction="compute it with the calculator, then answer 10811; mail jane.doe@example.com",
        )  # type: ignore[call-arg]
    )
    deadline = time.monotonic() + 30
    v2: dict[str, Any] | None = None
    while v2 is None and time.monotonic() < deadline:
        for d in await rewards(bus):
            if d["trajectory_id"] == lose.trajectory_id and d["metadata"]["version"] == 2:
                v2 = d
        await asyncio.sleep(0.05)
    await svc.stop()
    assert v2 is not None
    fix = v2["metadata"]["feedback"]["correction"]
    assert fix.startswith("compute it with the calculator, then answer 10811")
    assert "jane.doe@example.com" not in fix  # redacted like all feedback
    assert v2["metadata"]["partial_credit"]["bonus"] == f["metadata"]["partial_credit"]["bonus"]
    assert v2["total_reward"] == pytest.approx(f["total_reward"])  # feedback weight 0
    assert RewardEvent.model_validate(v2).version == 2


def test_the_service_collects_only_in_its_own_process_with_the_collector_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agentrl rewards serve` turns the collector off and collects between batches; in a
    shared process the bus only pauses it during a batch, which is no reason to walk the whole
    heap (13 full collections a quick loop)."""
    import gc

    from agentrl.rewards import service as module

    svc = RewardService(None, None, tmp_path)  # type: ignore[arg-type]
    was = gc.isenabled()
    gc.disable()  # as the bus's pause leaves it while a batch is handled
    try:
        svc._last_collect = 0.0
        svc._maybe_collect()
        assert svc._last_collect == 0.0  # a shared process: no collection
        monkeypatch.setattr(module, "_collect_here", True)  # what collector_off() sets
        svc._maybe_collect()
        assert svc._last_collect > 0.0  # the service's own process: collected
    finally:
        if was:
            gc.enable()
        svc.close()
