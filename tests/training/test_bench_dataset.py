"""`agentrl bench training`'s dataset figure runs the job's whole path on every trajectory:
all are read back, joined, and built into samples (two turns each)."""

from __future__ import annotations

from agentrl.bench.training import bench_dataset
from agentrl.bus import Bus
from agentrl.core.settings import Settings


async def test_bench_dataset_builds_every_trajectory(nats, data_dir):
    bus = await Bus.connect(nats.url, settings=Settings(data_dir=data_dir, nats_url=nats.url))
    try:
        await bus.ensure_streams()
        out = await bench_dataset(bus, 300)
    finally:
        await bus.close()
    assert out["trajectories"] == 300 and out["samples"] == 600
    assert out["total_s"] >= out["read_s"] + out["build_s"] > 0
    assert out["end_to_end_rate"] == 300 / out["total_s"]
