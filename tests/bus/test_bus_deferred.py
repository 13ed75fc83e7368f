"""Deferred outcomes: a batch handler that answers before its batch is durable (the reward
service commits in a worker thread) gets the next batch meanwhile, and the bus acks the
first one only once its outcomes are in; a failed deferred batch is redelivered, and a clean
stop settles and confirms what still waits."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from agentrl.bench.bus import sample_trajectory
from agentrl.bus import Bus, Deferred, Delivery
from agentrl.contracts.trajectory import TrajectoryEvent

SUBJECT = TrajectoryEvent.SUBJECT


def fresh(i: int) -> TrajectoryEvent:
    return sample_trajectory(i).model_copy(update={"trajectory_id": str(uuid.uuid4())})


async def test_next_batch_is_handled_before_the_deferred_one_is_acked(bus: Bus) -> None:
    await bus.publish_many([fresh(i) for i in range(200)])
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Future[None]] = []
    handled: list[int] = []
    ack_pending_seen: list[int] = []
    stop = asyncio.Event()

    async def handle(batch: list[Delivery]) -> Deferred:
        info = await bus.js.consumer_info("RL_TRAJECTORIES", "deferred")
        ack_pending_seen.append(info.num_ack_pending)
        handled.append(len(batch))
        if pending:  # the previous batch is still undecided while this one is handled
            assert not pending[-1].done()
            loop.call_later(0.05, pending[-1].set_result, None)
        fut: asyncio.Future[None] = loop.create_future()
        pending.append(fut)
        if sum(handled) >= 200:
            stop.set()
            fut.set_result(None)
        return Deferred(fut)

    stats = await bus.consume(SUBJECT, "deferred", batch_handler=handle, batch=50, stop=stop)
    assert sum(handled) == 200 and len(handled) >= 4
    # when batch k ran, batch k-1 was delivered and not acked yet (it was still deferred)
    assert all(seen >= size for seen, size in zip(ack_pending_seen[1:], handled, strict=False))
    assert stats.acked == 200 and stats.unconfirmed_batches == 0
    info = await bus.js.consumer_info("RL_TRAJECTORIES", "deferred")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_a_failed_deferred_batch_is_redelivered(bus: Bus) -> None:
    events = [fresh(i) for i in range(20)]
    await bus.publish_many(events)
    loop = asyncio.get_running_loop()
    seen: list[tuple[str, int]] = []
    stop = asyncio.Event()

    async def handle(batch: list[Delivery]) -> Deferred:
        seen.extend((d.event.trajectory_id, d.num_delivered) for d in batch)
        fut: asyncio.Future[None] = loop.create_future()
        if all(d.num_delivered == 1 for d in batch):
            fut.set_exception(OSError("disk full"))  # the commit failed: nak the batch
        else:
            fut.set_result(None)
        if len(seen) >= 40:
            stop.set()
        return Deferred(fut)

    stats = await bus.consume(
        SUBJECT, "deferred-fail", batch_handler=handle, batch=20, nak_delay=0.1, stop=stop
    )
    assert stats.nakked == 20 and stats.acked == 20 and stats.dead_lettered == 0
    assert sorted(t for t, n in seen if n == 2) == sorted(e.trajectory_id for e in events)
    assert any("disk full" in e for e in stats.errors)
    info = await bus.js.consumer_info("RL_TRAJECTORIES", "deferred-fail")
    assert info.num_ack_pending == 0


async def test_a_clean_stop_settles_the_waiting_batch_and_a_restart_sees_nothing_again(
    bus: Bus,
) -> None:
    events = [fresh(i) for i in range(30)]
    await bus.publish_many(events)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    got: list[str] = []

    async def handle(batch: list[Delivery]) -> Deferred:
        got.extend(d.event.trajectory_id for d in batch)
        fut: asyncio.Future[None] = loop.create_future()
        loop.call_later(0.3, fut.set_result, None)  # still waiting when the stop comes
        if len(got) >= 30:
            stop.set()
        return Deferred(fut)

    stats = await bus.consume(SUBJECT, "deferred-stop", batch_handler=handle, batch=30, stop=stop)
    assert stats.acked == 30 and stats.unconfirmed_batches == 0
    info = await bus.js.consumer_info("RL_TRAJECTORIES", "deferred-stop")
    assert info.num_ack_pending == 0

    again: list[Delivery] = []
    stop2 = asyncio.Event()

    async def handle2(batch: list[Delivery]) -> None:
        again.extend(batch)

    task = asyncio.create_task(
        bus.consume(SUBJECT, "deferred-stop", batch_handler=handle2, batch=30, stop=stop2)
    )
    await asyncio.sleep(1.0)
    stop2.set()
    await task
    assert again == []


async def test_a_transient_error_is_retried_without_a_warning_or_traceback(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """`TransientError` is a handler's 'come back later' (the training service's reward whose
    trajectory it has not indexed yet): the batch comes again, logged at INFO in one line,
    not as a failure with a traceback on the console of every loop."""
    import logging

    from agentrl.bus import TransientError

    events = [fresh(i) for i in range(5)]
    await bus.publish_many(events)
    stop = asyncio.Event()
    tries: list[int] = []

    async def handle(batch: list[Delivery]) -> None:
        tries.append(len(batch))
        if len(tries) == 1:
            raise TransientError("not indexed yet")
        if sum(tries[1:]) >= 5:
            stop.set()

    with caplog.at_level(logging.INFO, logger="agentrl.bus.client"):
        await bus.consume(SUBJECT, "transient", batch_handler=handle, stop=stop, nak_delay=0.1)
    assert sum(tries[1:]) == 5
    records = [r for r in caplog.records if "not indexed yet" in r.getMessage()]
    assert records and all(r.levelno == logging.INFO and not r.exc_info for r in records)
