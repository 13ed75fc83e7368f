"""`kv_keys` lists a bucket like nats-py's `keys()` (deleted keys left out) without leaving a
consumer behind for five minutes per call."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agentrl.bus import Bus, EmbeddedNats
from agentrl.bus.kv import kv_keys


async def test_kv_keys_lists_live_keys_and_leaves_no_consumers(tmp_path: Path) -> None:
    with EmbeddedNats(data_dir=tmp_path) as server:
        bus = await Bus.connect(server.url)
        try:
            kv = await bus.js.create_key_value(bucket="probe")
            assert await kv_keys(kv) == []
            for k in ("model.a", "model.b", "split.x"):
                await kv.put(k, b"{}")
            await kv.delete("model.b")
            for _ in range(30):  # a controller polling its registry
                assert sorted(await kv_keys(kv)) == ["model.a", "split.x"]
            # the listing consumers' inactivity threshold is 2 s: the server removes them
            # then (polled, not slept: a fixed 3.5 s was both slow and short under load)
            deadline = time.monotonic() + 30
            while (count := (await bus.js.stream_info("KV_probe")).state.consumer_count) > 0:
                assert time.monotonic() < deadline, f"{count} listing consumers left behind"
                await asyncio.sleep(0.2)
        finally:
            await bus.close()


async def test_kv_keys_never_lists_a_full_bucket_as_empty_when_the_loop_stalls(
    tmp_path: Path,
) -> None:
    """nats-py's end-of-initial-values marker comes first when the consumer's info says
    nothing is pending while its messages still wait in the client's queue (a stalled event
    loop on a loaded host): the listing must wait for the last entry, not trust the marker."""
    import random

    with EmbeddedNats(data_dir=tmp_path) as server:
        bus = await Bus.connect(server.url)
        try:
            kv = await bus.js.create_key_value(bucket="probe")
            for i in range(50):
                await kv.put(f"model.{i}", b"{}")
            await kv.delete("model.3")
            rng = random.Random(0)

            async def stall(after: float) -> None:
                await asyncio.sleep(after)
                time.sleep(0.05)  # the event loop blocked, as on a loaded host

            wrong = 0
            for _ in range(100):
                task = asyncio.create_task(stall(rng.choice([0, 0.0005, 0.001, 0.002, 0.004])))
                keys = await kv_keys(kv)
                await task
                wrong += sorted(keys) != sorted(f"model.{i}" for i in range(50) if i != 3)
            assert wrong == 0
        finally:
            await bus.close()
