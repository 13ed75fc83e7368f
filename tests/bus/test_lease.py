"""KV leases on a real nats-server: one holder at a time, a renewal that finds its lease
taken says so, an expired lease goes to the next asker, a restarted holder takes its own
back, and `while_leader` hands the work over when the leader stops renewing."""

from __future__ import annotations

import asyncio
import time
import uuid

from agentrl.bus import Bus
from agentrl.bus.lease import Lease, holder, lease_bucket, while_leader

TTL = 1.5


async def test_one_holder_expiry_and_a_lost_renewal(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    try:
        kv = await lease_bucket(bus.js, TTL)
        key = f"t.{uuid.uuid4().hex}"
        a, b = Lease(kv, key, "a", TTL), Lease(kv, key, "b", TTL)
        assert await a.acquire() and a.held
        assert not await b.acquire()  # create-only: a holds it
        assert await a.renew() and await holder(kv, key) == "a"
        # a stops renewing: the key expires on the server, b takes it
        t0 = time.monotonic()
        while not await b.acquire():
            await asyncio.sleep(0.1)
            assert time.monotonic() - t0 < TTL * 4
        assert time.monotonic() - t0 >= TTL * 0.5
        assert not a.held or not await a.renew()  # a's renewal finds b there
        assert not a.held and await holder(kv, key) == "b"
        # b restarts under the same name: its own lease back at once
        b2 = Lease(kv, key, "b", TTL)
        assert await b2.acquire()
        await b2.release()
        assert await holder(kv, key) is None
        assert await a.acquire()
    finally:
        await bus.close()


async def test_while_leader_hands_over_when_the_leader_stops_renewing(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    kv = await lease_bucket(bus.js, TTL)
    key = f"t.{uuid.uuid4().hex}"
    leading: list[str] = []

    def work(name: str):  # type: ignore[no-untyped-def]
        async def run(leader_stop: asyncio.Event) -> None:
            leading.append(name)
            await leader_stop.wait()

        return run

    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    a = asyncio.create_task(while_leader(Lease(kv, key, "a", TTL), work("a"), stop_a))
    await asyncio.sleep(0.5)
    b = asyncio.create_task(while_leader(Lease(kv, key, "b", TTL), work("b"), stop_b))
    try:
        await asyncio.sleep(TTL * 2)
        assert leading == ["a"]  # b stood by while a renewed
        a.cancel()  # a dies without releasing (no renewal any more)
        t0 = time.monotonic()
        while leading != ["a", "b"]:
            await asyncio.sleep(0.05)
            assert time.monotonic() - t0 < TTL * 4, leading
    finally:
        stop_b.set()
        await asyncio.wait_for(b, 10)
        assert await holder(kv, key) is None  # released on a clean stop
        await bus.close()
