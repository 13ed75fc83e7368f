"""`kv_keys` lists a bucket like nats-py's `keys()` (deleted keys left out) without leaving a
consumer behind for five minutes per call."""

from __future__ import annotations

import asyncio
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
            await asyncio.sleep(3.5)  # the listing consumers' inactivity threshold is 2 s
            info = await bus.js.stream_info("KV_probe")
            assert info.state.consumer_count == 0
        finally:
            await bus.close()
