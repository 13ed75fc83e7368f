"""Profiling harnesses for the reward service (the commands are in BENCHMARKS.md).

    python -m agentrl.rewards.profiling handler 5120          # reward side only, cProfile
    python -m agentrl.rewards.profiling handler-code 1024     # the same with code (ruff, bandit)
    python -m agentrl.rewards.profiling service 10000         # whole service + bus, cProfile
    python -m agentrl.rewards.profiling service 10000 --plain # no profiler: CPU µs/trajectory
    py-spy record -o rewards.svg -- python -m agentrl.rewards.profiling service 20000 --plain

`handler` feeds pre-validated trajectories (10 % with PII) straight to the batch handler (no
bus, publishing stubbed out), so it measures redaction, scoring and the SQLite commit alone.
`service` preloads the trajectories into an embedded nats-server and times the service
draining them (fetch, validation, acks, publishing included).
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

from agentrl.contracts.samples import sample_trajectory


class _Msg:
    """What the batch handler reads of a NATS message: its bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data


def _payloads(n: int, code: bool = False) -> list[bytes]:
    rng = random.Random(1)
    return [
        json.dumps(sample_trajectory(i, rng=rng, pii=i % 10 == 3, code=code)).encode()
        for i in range(n)
    ]


async def _handler(n: int, prof: cProfile.Profile | None, code: bool = False) -> float:
    from agentrl.bus import Delivery
    from agentrl.contracts.trajectory import TrajectoryEvent
    from agentrl.rewards.service import RewardService, collector_off

    raws = _payloads(n, code)
    deliveries = [
        Delivery(_Msg(r), TrajectoryEvent.model_validate_json(r))  # type: ignore[arg-type]
        for r in raws
    ]
    with tempfile.TemporaryDirectory() as tmp:
        svc = RewardService(None, None, tmp)  # type: ignore[arg-type]
        svc._publish_later = lambda items: None  # type: ignore[method-assign]
        collector_off()
        c0, t0 = time.process_time(), time.perf_counter()
        if prof:
            prof.enable()
        for k in range(0, n, 256):
            await (await svc.handle_trajectories(deliveries[k : k + 256])).outcomes
        if prof:
            prof.disable()
        c1, t1 = time.process_time(), time.perf_counter()
        svc.close()
    print(f"{n / (t1 - t0):,.0f} trajectories/s through the handler (wall)")
    return (c1 - c0) / n * 1e6


async def _service(n: int, prof: cProfile.Profile | None) -> float:
    from agentrl.bus import Bus, EmbeddedNats
    from agentrl.contracts.subjects import TRAJECTORY
    from agentrl.rewards.service import RewardService, collector_off

    raws = _payloads(n)
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(data_dir=Path(tmp) / "nats")
        server.start()
        try:
            bus = await Bus.connect(server.url)
            await bus.ensure_streams()
            items = [(TRAJECTORY, r, str(json.loads(r)["trajectory_id"])) for r in raws]
            for k in range(0, n, 2000):
                await bus.publish_many(items[k : k + 2000])
            svc_bus = await Bus.connect(server.url)
            svc = RewardService(svc_bus, None, Path(tmp) / "data")
            stop = asyncio.Event()
            collector_off()
            c0, t0 = time.process_time(), time.perf_counter()
            if prof:
                prof.enable()
            task = asyncio.create_task(svc.run(stop))
            while svc.counters["trajectories_scored"] < n and not task.done():
                await asyncio.sleep(0.01)
            if prof:
                prof.disable()
            c1, t1 = time.process_time(), time.perf_counter()
            stop.set()
            await task
            print(f"{n / (t1 - t0):,.0f} trajectories/s (wall, this process and nats-server)")
            await bus.close()
            await svc_bus.close()
        finally:
            server.stop()
    return (c1 - c0) / n * 1e6


def main(argv: list[str]) -> None:
    if len(argv) < 1 or argv[0] not in ("handler", "handler-code", "service"):
        raise SystemExit(__doc__)
    n = int(argv[1]) if len(argv) > 1 else 5120
    prof = None if "--plain" in argv else cProfile.Profile()
    if argv[0] == "service":
        us = asyncio.run(_service(n, prof))
    else:
        us = asyncio.run(_handler(n, prof, code=argv[0] == "handler-code"))
    print(f"{argv[0]}: {us:.1f} µs of CPU per trajectory (this process, n={n})")
    if prof is not None:
        prof.dump_stats(f"rewards-{argv[0]}.prof")
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main(sys.argv[1:])
