"""Confirmed acks (a clean stop leaves nothing pending, a restart sees no redelivery) and
dead letters that can always be written (a large poison message never stops a consumer)."""

from __future__ import annotations

import asyncio
import json
import uuid

from agentrl.bench.bus import sample_trajectory
from agentrl.bus import Bus, ConsumeStats, Delivery
from agentrl.contracts.trajectory import TrajectoryEvent

SUBJECT = TrajectoryEvent.SUBJECT


def fresh(i: int) -> TrajectoryEvent:
    return sample_trajectory(i).model_copy(update={"trajectory_id": str(uuid.uuid4())})


async def wait_for(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


async def test_clean_stop_confirms_acks_and_restart_sees_no_redelivery(bus: Bus) -> None:
    events = [fresh(i) for i in range(600)]
    await bus.publish_many(events)
    first: list[Delivery] = []
    stop = asyncio.Event()

    async def handle(batch: list[Delivery]) -> None:
        first.extend(batch)
        if len(first) >= 250:  # stop in the middle of a backlog, with batches requested ahead
            stop.set()

    # ack_wait 3 s: a loaded host (CI) once took over 1 s between a delivery and its ack,
    # and the server redelivered inside one consumer's run
    stats = await bus.consume(
        SUBJECT, "restart", batch_handler=handle, batch=64, ack_wait=3.0, stop=stop
    )
    # Every handled message is acked and the server has applied it: nothing pending now,
    # not "eventually".
    info = await bus.js.consumer_info("RL_TRAJECTORIES", "restart")
    assert info.num_ack_pending == 0
    assert stats.acked == len(first) and stats.unconfirmed_batches == 0
    assert stats.confirmed_at > 0

    second: list[Delivery] = []
    stop2 = asyncio.Event()

    async def handle2(batch: list[Delivery]) -> None:
        second.extend(batch)

    task = asyncio.create_task(
        bus.consume(SUBJECT, "restart", batch_handler=handle2, batch=64, ack_wait=3.0, stop=stop2)
    )
    await wait_for(lambda: len(first) + len(second) >= 600)
    stop2.set()
    stats2 = await task
    # every ack of both runs applied by the server and none redelivered: with nothing
    # pending, nothing can come again (was a fixed 6.5 s, 2 x ack_wait, watching for one)
    info = await bus.js.consumer_info("RL_TRAJECTORIES", "restart")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0, info
    assert stats2.acked == len(second) and stats2.unconfirmed_batches == 0
    ids1 = [d.event.trajectory_id for d in first]
    ids2 = [d.event.trajectory_id for d in second]
    assert not set(ids1) & set(ids2), "a message handled before the stop came again"
    assert sorted(ids1 + ids2) == sorted(e.trajectory_id for e in events)
    assert all(d.num_delivered == 1 for d in first + second)


async def test_ack_confirmation_is_pipelined_and_reports_what_the_server_did_not_answer(
    bus: Bus,
) -> None:
    """A batch's acks go out at once and are confirmed while the next batch is handled:
    when a batch handler runs, the acks of the batch before the previous one are applied
    already. An ack nobody answers (no responders) is reported unconfirmed, not hung on."""
    from agentrl.bus import wire

    await bus.publish_many([fresh(i) for i in range(300)])
    sizes: list[int] = []
    applied: list[int] = []  # acks the server had applied when each batch's handler ran
    stop = asyncio.Event()

    async def handle(batch: list[Delivery]) -> None:
        info = await bus.js.consumer_info("RL_TRAJECTORIES", "pipelined")
        applied.append(info.delivered.consumer_seq - info.num_ack_pending)
        sizes.append(len(batch))
        if sum(sizes) >= 300:
            stop.set()

    stats = await bus.consume(SUBJECT, "pipelined", batch_handler=handle, batch=50, stop=stop)
    assert stats.acked == 300 and stats.unconfirmed_batches == 0
    assert (await bus.js.consumer_info("RL_TRAJECTORIES", "pipelined")).num_ack_pending == 0
    assert len(sizes) >= 3
    for k in range(2, len(sizes)):  # batch k-2's confirmation was awaited before batch k
        assert applied[k] >= sum(sizes[: k - 1]), (k, applied, sizes)

    confirmer = wire.AckConfirmer(bus.nc)
    token = await confirmer.send([("agentrl.test.nobody.acks", wire.ACK)])
    assert await confirmer.confirmed(token, 2.0) is False
    await confirmer.close()


async def test_large_poison_message_is_dead_lettered_by_reference(bus: Bus) -> None:
    """Base64 makes a message above ~3/4 of max_payload too large to copy into RL_DLQ:
    before the fix, PayloadTooLargeError escaped consume() and the message was never
    terminated, so every restart died on it again."""
    limit = bus.nc.max_payload
    pad = "x" * int(limit * 0.8)
    poison = json.dumps({"trajectory_id": "big-bad", "turns": "nope", "pad": pad}).encode()
    ack = await bus.publish_raw(SUBJECT, poison, f"big-{uuid.uuid4()}")
    good = fresh(1)
    await bus.publish(good)
    got: list[TrajectoryEvent] = []
    stop = asyncio.Event()
    stats = ConsumeStats()

    async def handle(event: TrajectoryEvent) -> None:
        got.append(event)
        stop.set()

    task = asyncio.create_task(bus.consume(SUBJECT, "bigpoison", handle, stop=stop, stats=stats))
    await asyncio.wait_for(stop.wait(), 20)
    await task  # returns normally: nothing escaped
    assert [e.trajectory_id for e in got] == [good.trajectory_id]
    [record] = await bus.dead_letters()
    assert record["error_kind"] == "validation" and "turns" in record["error"]
    assert "data_b64" not in record and record["data_truncated"] is True
    assert record["data_ref"] == {"stream": "RL_TRAJECTORIES", "seq": ack.seq}
    assert record["data_bytes"] == len(poison)
    assert record["data_excerpt"].startswith('{"trajectory_id": "big-bad"')
    # The original is still in the stream under that reference, and it was terminated.
    original = await bus.js.get_msg("RL_TRAJECTORIES", ack.seq)
    assert original.data == poison
    info = await bus.js.consumer_info("RL_TRAJECTORIES", "bigpoison")
    assert info.num_ack_pending == 0 and info.num_pending == 0
    assert stats.dead_lettered == 1 and stats.dlq_failures == 0


async def test_dead_letter_that_cannot_be_stored_still_terminates_and_goes_on(
    nats_url: str, bus: Bus
) -> None:
    """RL_DLQ missing (or unreachable): the publish is retried, then given up, counted and
    logged with the original's stream sequence; the poison message is terminated anyway
    and the consumer keeps going."""
    quick = await Bus.connect(nats_url, publish_retries=1, publish_timeout=0.5)
    try:
        await quick.js.delete_stream("RL_DLQ")
        await quick.publish_raw(SUBJECT, b"not json", f"bad-{uuid.uuid4()}")
        good = fresh(2)
        await quick.publish(good)
        got: list[TrajectoryEvent] = []
        stop = asyncio.Event()

        async def handle(event: TrajectoryEvent) -> None:
            got.append(event)
            stop.set()

        stats = ConsumeStats()
        task = asyncio.create_task(quick.consume(SUBJECT, "nodlq", handle, stop=stop, stats=stats))
        await asyncio.wait_for(stop.wait(), 30)
        await task
        assert [e.trajectory_id for e in got] == [good.trajectory_id]
        assert stats.dlq_failures == 1 and stats.dead_lettered == 1
        info = await quick.js.consumer_info("RL_TRAJECTORIES", "nodlq")
        assert info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        await quick.close()
