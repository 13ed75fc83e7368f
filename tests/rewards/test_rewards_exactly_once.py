"""Exactly-once rewards at any delay, structured shutdown, and outbox bookkeeping.

JetStream's duplicate window is shrunk to one second here, so nothing passes because a copy
happened to fall inside the default 120 s window; every wait is for a condition."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import nats.js.errors
import orjson
import pytest
from nats.js.api import ConsumerConfig, RetentionPolicy

from agentrl.bench.rewards import read_stream
from agentrl.bus import Bus, EmbeddedNats
from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.subjects import REWARD, TRAJECTORY
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.rewards import RewardConfig, ScoringInput, score_batch
from agentrl.rewards.service import RewardService
from agentrl.rewards.store import RewardStore
from agentrl.rewards.window import WindowState

STREAMS = ("RL_TRAJECTORIES", "RL_REWARDS", "RL_FEEDBACK", "RL_DLQ")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    srv = EmbeddedNats(data_dir=tmp_path_factory.mktemp("rewards-once-nats"))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture()
async def bus(server: EmbeddedNats) -> AsyncIterator[Bus]:
    b = await Bus.connect(server.url, name="rewards-once-test")
    await b.ensure_streams()
    for stream in STREAMS:
        await b.js.purge_stream(stream)
    yield b
    await asyncio.wait_for(b.close(), 10)


@pytest.fixture()
async def own_bus(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bus]:
    """A server of this test's own, for a test that breaks a stream: whatever happens to
    the test (a failure, pytest-timeout's signal, which skips its `finally`), the broken
    stream is gone with the server and never reaches the module's later tests."""
    srv = EmbeddedNats(data_dir=tmp_path_factory.mktemp("rewards-once-own-nats"))
    srv.start()
    try:
        b = await Bus.connect(srv.url, name="rewards-once-own")
        await b.ensure_streams()
        yield b
        await asyncio.wait_for(b.close(), 10)
    finally:
        srv.stop()


async def ended(task: asyncio.Task[Any], timeout: float) -> bool:
    """Whether `task` ended within `timeout` seconds. Unlike `asyncio.wait_for`, this never
    waits on: a task that ignores its cancellation is reported, not waited for forever."""
    done, _ = await asyncio.wait({task}, timeout=timeout)
    return bool(done)


async def until(
    cond: Callable[[], Awaitable[bool]],
    what: str,
    timeout: float = 30.0,
    detail: Callable[[], str] = str,
) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what} {detail()}"
        await asyncio.sleep(0.02)


async def shrink_duplicate_windows(bus: Bus, seconds: float = 1.0) -> None:
    """JetStream drops a repeated Nats-Msg-Id only inside this window."""
    for stream in ("RL_TRAJECTORIES", "RL_REWARDS"):
        cfg = (await bus.js.stream_info(stream)).config
        cfg.duplicate_window = seconds
        await bus.js.update_stream(cfg)


async def consumer_exists(bus: Bus, durable: str) -> bool:
    try:
        await bus.js.consumer_info("RL_TRAJECTORIES", durable)
    except Exception:
        return False
    return True


async def all_acked(bus: Bus, durable: str) -> bool:
    """The consumer has acked every trajectory the stream holds."""
    last = (await bus.js.stream_info("RL_TRAJECTORIES")).state.last_seq
    info = await bus.js.consumer_info("RL_TRAJECTORIES", durable)
    return info.ack_floor.stream_seq == last and not info.num_ack_pending


async def reward_count(bus: Bus) -> int:
    return int((await bus.js.stream_info("RL_REWARDS")).state.messages)


def fresh(i: int) -> dict[str, Any]:
    return sample_trajectory(i, trajectory_id=str(uuid.uuid4()))


class Service:
    def __init__(self, bus: Bus, data_dir: Path, durable: str, **kw: Any) -> None:
        self.service = RewardService(bus, RewardConfig(), data_dir, durable=durable, **kw)
        self.stop_event = asyncio.Event()
        self.task = asyncio.create_task(self.service.run(self.stop_event))

    async def stop(self) -> None:
        self.stop_event.set()
        assert await ended(self.task, 30), "the service did not stop within 30 s"
        await self.task  # its error, if it failed


async def started(bus: Bus, tmp_path: Path, durable: str) -> Service:
    svc = Service(bus, tmp_path, durable)
    await until(lambda: consumer_exists(bus, durable), "the consumer")
    # a second replica finds the consumer already there: wait for its own ensure_streams()
    # (the claims open right after it), which would put the default window back (under
    # load the feedback test then saw version 1's republish dropped as a duplicate)
    await until(lambda: _true(svc.service.claims is not None), "the service's streams")
    await shrink_duplicate_windows(bus)  # after the service's ensure_streams()
    return svc


async def _true(value: bool) -> bool:
    return value


async def test_trajectory_redelivered_after_the_duplicate_window_is_not_rewarded_twice(
    bus: Bus, tmp_path: Path
) -> None:
    name = f"once-{uuid.uuid4().hex[:8]}"
    svc = await started(bus, tmp_path, name)
    doc = fresh(1)
    await bus.publish(TrajectoryEvent.model_validate(doc))
    await until(lambda: _ge(reward_count(bus), 1), "the first reward")
    first = (await read_stream(bus, "RL_REWARDS", REWARD))[0]
    # Past the 1 s window JetStream stores any copy; the producer retries the trajectory.
    await asyncio.sleep(1.5)
    await bus.publish_raw(TRAJECTORY, json.dumps(doc).encode(), "a-late-producer-retry")
    await until(lambda: all_acked(bus, name), "the redelivered trajectory to be acked")
    await svc.stop()  # drains every publish in flight
    got = await read_stream(bus, "RL_REWARDS", REWARD)
    assert [d["reward_id"] for d in got] == [first["reward_id"]]
    assert svc.service.counters["trajectories_scored"] == 1
    assert svc.service.counters["redelivered"] == 1


async def test_outbox_replay_skips_rewards_the_stream_already_holds(
    bus: Bus, tmp_path: Path
) -> None:
    name = f"once-{uuid.uuid4().hex[:8]}"
    svc = await started(bus, tmp_path, name)
    await bus.publish(TrajectoryEvent.model_validate(fresh(2)))
    await until(lambda: _ge(reward_count(bus), 1), "the reward")
    await svc.stop()
    (published,) = await read_stream(bus, "RL_REWARDS", REWARD)
    # The state a crash between JetStream's PubAck and the confirm leaves: the reward is
    # stored in the stream and still in the outbox.
    db = sqlite3.connect(tmp_path / "rewards" / "state.sqlite")
    with db:
        db.execute(
            # a row as an older state file has it (no payload of its own: the latest is used)
            "INSERT INTO outbox (reward_id, trajectory_id, created_at) VALUES (?, ?, ?)",
            (published["reward_id"], published["trajectory_id"], time.time()),
        )
    db.close()
    await asyncio.sleep(1.5)  # past the stream's 1 s duplicate window
    again = Service(bus, tmp_path, name)
    await until(lambda: consumer_exists(bus, name), "the consumer")
    await again.stop()
    got = await read_stream(bus, "RL_REWARDS", REWARD)
    assert [d["reward_id"] for d in got] == [published["reward_id"]]
    assert again.service.counters["outbox_already_published"] == 1
    assert RewardStore(tmp_path / "rewards" / "state.sqlite").outbox() == []


async def test_a_failing_consumer_stops_the_whole_service(own_bus: Bus, tmp_path: Path) -> None:
    """The feedback consumer cannot be created (RL_FEEDBACK was made a work-queue stream and
    another consumer already owns its subject): the service must stop with that error, its
    trajectory consumer cancelled, not left running on a closed store."""
    bus = own_bus
    name = f"once-{uuid.uuid4().hex[:8]}"
    spec = (await bus.js.stream_info("RL_FEEDBACK")).config
    await bus.js.delete_stream("RL_FEEDBACK")
    await bus.js.add_stream(replace(spec, retention=RetentionPolicy.WORK_QUEUE))
    await bus.js.add_consumer("RL_FEEDBACK", ConsumerConfig(durable_name="someone-else"))
    before = set(asyncio.all_tasks())
    svc = Service(bus, tmp_path, name)
    try:
        assert await ended(svc.task, 30), "the service ran on after its feedback consumer failed"
        with pytest.raises(nats.js.errors.BadRequestError):
            await svc.task
        await asyncio.sleep(0)  # let cancellations land
        left = [
            t.get_name()
            for t in asyncio.all_tasks() - before
            if t is not asyncio.current_task() and not t.done()
        ]
        assert left == [], f"tasks still running after the service failed: {left}"
        # The trajectory consumer is gone: a trajectory published now stays undelivered.
        await bus.publish(TrajectoryEvent.model_validate(fresh(3)))
        await asyncio.sleep(0.3)
        info = await bus.js.consumer_info("RL_TRAJECTORIES", name)
        assert info.delivered.consumer_seq == 0 and info.num_pending == 1
        with pytest.raises(sqlite3.ProgrammingError):  # closed after its consumers stopped
            svc.service.store.count()
    finally:  # never a service left running into the next tests
        svc.stop_event.set()
        svc.task.cancel()
        await ended(svc.task, 10)


async def cancel_as_the_answer_lands(nc: Any, task: asyncio.Task[Any]) -> None:
    """Cancel `task` in the loop turn where the answer to its first request lands."""
    deadline = time.monotonic() + 10
    while not nc._resp_map:  # nats-py's requests in flight, by inbox token
        assert time.monotonic() < deadline, "no request was made"
        await asyncio.sleep(0)
    answer = next(iter(nc._resp_map.values()))
    answer.add_done_callback(lambda _: task.cancel())


async def test_a_request_cancelled_as_its_answer_lands_is_cancelled(bus: Bus) -> None:
    """Python 3.11's `asyncio.wait_for`, inside nats-py's every request, returns the answer
    and drops the cancellation when both land in the same loop turn. The reward service's
    trajectory consumer lost its TaskGroup's cancel that way (the feedback consumer beside
    it had failed) and ran on, so the service never stopped: the failing-consumer test
    above hung 300 s in the suite. The bus's client raises the cancellation."""
    task = asyncio.create_task(bus.js.stream_info("RL_REWARDS"))
    await cancel_as_the_answer_lands(bus.nc, task)
    assert await ended(task, 5)
    assert task.cancelled(), f"the request answered {task.result()!r} and was not cancelled"


async def test_a_consumer_cancelled_as_its_answer_lands_still_stops(
    server: EmbeddedNats,
) -> None:
    """The same lost cancellation, on a client that is not the bus's own (as Agent Zero's
    publisher makes): the consumer notices the cancel it never got, instead of running on
    until its stop event."""
    import nats

    bus = Bus(await nats.connect(server.url))
    stop = asyncio.Event()

    async def handler(batch: list[Any]) -> None:
        return None

    task = asyncio.create_task(
        bus.consume(TRAJECTORY, f"lost-{uuid.uuid4().hex[:8]}", batch_handler=handler, stop=stop)
    )
    try:
        await cancel_as_the_answer_lands(bus.nc, task)  # the consumer's info
        assert await ended(task, 5), "the consumer ran on after it was cancelled"
        assert task.cancelled()
    finally:
        stop.set()
        await ended(task, 10)
        await asyncio.wait_for(bus.close(), 10)


async def test_counters_move_only_when_the_batch_commits(bus: Bus, tmp_path: Path) -> None:
    name = f"once-{uuid.uuid4().hex[:8]}"
    svc = await started(bus, tmp_path, name)
    # A real SQLite failure inside the batch transaction (think: disk full).
    svc.service.store.db.execute(
        "CREATE TEMP TRIGGER fail_commit BEFORE INSERT ON rewards "
        "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
    )
    docs = [fresh(10 + i) for i in range(5)]
    await bus.publish_many([TrajectoryEvent.model_validate(d) for d in docs])
    stats = svc.service.trajectory_stats
    await until(lambda: _true(stats.nakked >= 10), "two failed attempts")
    assert svc.service.counters["trajectories_scored"] == 0
    assert svc.service.counters["rewards_published"] == 0
    assert await reward_count(bus) == 0
    svc.service.store.db.execute("DROP TRIGGER fail_commit")
    await until(lambda: _ge(reward_count(bus), 5), "the rewards after the disk recovered")
    await svc.stop()
    assert svc.service.counters["trajectories_scored"] == 5
    assert svc.service.counters["rewards_published"] == 5
    persisted = RewardStore(tmp_path / "rewards" / "state.sqlite").load_counters()
    assert persisted["trajectories_scored"] == 5


def test_pruning_keeps_rewards_that_were_never_confirmed(tmp_path: Path) -> None:
    items = [ScoringInput(TrajectoryEvent.model_validate(fresh(20 + i))) for i in range(2)]
    (kept, gone), _ = score_batch(items, WindowState(), RewardConfig())
    store = RewardStore(tmp_path / "state.sqlite")
    store.commit(
        rewards=[(r.trajectory_id, 1, r.to_json(), {}) for r in (kept, gone)],
        outbox=[(kept.reward_id, kept.trajectory_id, kept.to_json())],  # `gone` was confirmed
    )
    store.db.execute("UPDATE rewards SET scored_at = scored_at - 100 * 86400")
    assert store.prune(30 * 86400) == 1
    assert [rid for rid, _ in store.outbox()] == [kept.reward_id]  # still publishable
    assert set(store.rewards([kept.trajectory_id, gone.trajectory_id])) == {kept.trajectory_id}
    store.close()


def test_each_unpublished_version_is_replayed_as_itself(tmp_path: Path) -> None:
    """A crash left version 1 unpublished and feedback's version 2 came after it: both are
    replayed, each under its own id with its own payload (the outbox used to answer every
    row with the trajectory's latest reward, so version 1 was never published: the soak's
    reward-version gaps)."""
    from agentrl.rewards.calculator import rescore_with_feedback
    from agentrl.rewards.components import FeedbackState

    item = ScoringInput(TrajectoryEvent.model_validate(fresh(40)))
    (v1,), state = score_batch([item], WindowState(), RewardConfig())
    fb = FeedbackState()
    fb.apply("thumbs_down", None, "fb-1")
    v2 = rescore_with_feedback(v1.payload, fb, state, RewardConfig())
    assert v2.version == 2 and v2.reward_id != v1.reward_id
    path = tmp_path / "state.sqlite"
    store = RewardStore(path)
    store.commit(
        rewards=[(v1.trajectory_id, 1, v1.to_json(), {})],
        outbox=[(v1.reward_id, v1.trajectory_id, v1.to_json())],
    )
    store.commit(
        rewards=[(v2.trajectory_id, 2, v2.to_json(), fb.to_dict())],
        outbox=[(v2.reward_id, v2.trajectory_id, v2.to_json())],
    )
    store.close()
    store = RewardStore(path)  # the restart
    rows = store.outbox()
    assert [rid for rid, _ in rows] == [v1.reward_id, v2.reward_id]
    assert [orjson.loads(data)["reward_id"] for _, data in rows] == [v1.reward_id, v2.reward_id]
    assert [orjson.loads(data)["metadata"]["version"] for _, data in rows] == [1, 2]
    store.close()


async def test_a_committed_version_no_one_published_is_published_before_feedback_supersedes_it(
    bus: Bus, tmp_path: Path
) -> None:
    """A replica committed version 1 to the shared record and died before publishing it;
    feedback then reaches another replica (its own data dir, as on another machine). Version
    1 must still reach the stream, under its own id, beside feedback's version 2 (the
    trajectory's redelivery would find version 2 in the record and publish nothing older)."""
    from agentrl.contracts.feedback import FeedbackEvent

    name = f"once-{uuid.uuid4().hex[:8]}"
    first = await started(bus, tmp_path / "a", name)
    doc = fresh(41)
    await bus.publish(TrajectoryEvent.model_validate(doc))
    await until(lambda: _ge(reward_count(bus), 1), "version 1")
    await first.stop()
    (v1,) = await read_stream(bus, "RL_REWARDS", REWARD)
    # the stream as that replica's death left it: the record holds version 1; the stream
    # never saw it, not even its id (a new stream: deleting the message would leave the id in
    # the duplicate window, and waiting the window out raced the replicas' ensure_streams()
    # under load: CI, 2026-11-28)
    await bus.js.delete_stream("RL_REWARDS")
    await bus.ensure_streams()
    assert await reward_count(bus) == 0
    other = await started(bus, tmp_path / "b", name)
    await bus.publish(
        FeedbackEvent(
            trajectory_id=doc["trajectory_id"], timestamp="2026-11-27T08:00:00Z", type="thumbs_up"
        )
    )
    await until(
        lambda: _ge(reward_count(bus), 2),
        "versions 1 and 2",
        detail=lambda: f"counters {dict(other.service.counters)}",
    )
    await other.stop()
    got = await read_stream(bus, "RL_REWARDS", REWARD)
    assert [d["metadata"]["version"] for d in got] == [1, 2]
    assert got[0]["reward_id"] == v1["reward_id"]
    assert other.service.counters["republished_committed"] == 1


async def _ge(value: Awaitable[int], want: int) -> bool:
    return await value >= want


async def _true(value: bool) -> bool:
    return value
