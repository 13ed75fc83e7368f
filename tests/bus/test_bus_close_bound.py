"""`Bus.close()` has a bound of its own: nats-py's drain waits 30 s for a subscription whose
handler is still busy, which held a stopping service (a second signal's stop) that long.
Real nats-server; each test's bus is its own connection."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from agentrl.bench.bus import sample_trajectory
from agentrl.bus import Bus, Delivery, current_delivery
from agentrl.contracts.trajectory import TrajectoryEvent


async def test_a_blocked_subscription_handler_does_not_hold_close_beyond_its_bound(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    bus = await Bus.connect(nats_url, close_timeout=1.0)
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def blocked(msg: object) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            cancelled.set()
            raise

    subject = f"h107.blocked.{uuid.uuid4().hex[:8]}"
    await bus.nc.subscribe(subject, cb=blocked)
    await bus.nc.publish(subject, b"1")
    await bus.nc.publish(subject, b"2")  # queued behind the blocked one
    await asyncio.wait_for(entered.wait(), 10)
    started = time.monotonic()
    await asyncio.wait_for(bus.close(), 25)  # nats-py's own drain would take 30 s
    took = time.monotonic() - started
    assert bus.nc.is_closed
    assert 0.9 <= took < 6.0, f"close() took {took:.1f} s"  # the bound, not a skipped drain
    await asyncio.sleep(0)
    assert cancelled.is_set(), "the blocked handler was left running"
    assert "still busy at close" in caplog.text  # said, so a held stop can be told apart


async def test_close_still_drains_a_handler_that_finishes_within_the_bound(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The bound cuts only what is stuck: queued messages of a working handler are still
    handled before close() returns, as a drain does."""
    bus = await Bus.connect(nats_url, close_timeout=5.0)
    handled: list[bytes] = []

    async def slowish(msg) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.05)
        handled.append(msg.data)

    subject = f"h107.slowish.{uuid.uuid4().hex[:8]}"
    await bus.nc.subscribe(subject, cb=slowish)
    for i in range(10):
        await bus.nc.publish(subject, str(i).encode())
    await bus.nc.flush()
    await asyncio.sleep(0.1)  # delivered to the client, most still queued behind the handler
    assert len(handled) < 10
    await asyncio.wait_for(bus.close(), 25)
    assert bus.nc.is_closed
    assert handled == [str(i).encode() for i in range(10)]
    assert "still busy at close" not in caplog.text


async def test_a_consumer_stuck_in_its_handler_is_cut_at_close_and_its_message_redelivered(
    bus: Bus, nats_url: str
) -> None:
    """Nothing lost: the message whose handler never finished was not acked, and the next
    consumer on the same durable gets it again. (`bus`: the streams emptied, publishing.)"""
    stuck_bus = await Bus.connect(nats_url, close_timeout=1.0)
    durable = f"h107close{uuid.uuid4().hex[:8]}"
    event = sample_trajectory(0).model_copy(update={"trajectory_id": str(uuid.uuid4())})
    entered = asyncio.Event()

    async def stuck(event: TrajectoryEvent) -> None:
        entered.set()
        await asyncio.Event().wait()

    consuming = asyncio.create_task(
        stuck_bus.consume(TrajectoryEvent.SUBJECT, durable, stuck, ack_wait=2.0)
    )
    try:
        await bus.publish(event)
        await asyncio.wait_for(entered.wait(), 15)
        started = time.monotonic()
        await asyncio.wait_for(stuck_bus.close(), 25)
        took = time.monotonic() - started
        assert took < 6.0, f"close() took {took:.1f} s with a consumer stuck in its handler"
    finally:
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)

    again: list[Delivery] = []
    stop = asyncio.Event()

    async def take(event: TrajectoryEvent) -> None:
        again.append(current_delivery())
        stop.set()

    await asyncio.wait_for(
        bus.consume(TrajectoryEvent.SUBJECT, durable, take, ack_wait=2.0, stop=stop), 30
    )
    assert [d.event.trajectory_id for d in again] == [event.trajectory_id]
    assert again[0].num_delivered >= 2
    await bus.js.delete_consumer("RL_TRAJECTORIES", durable)
