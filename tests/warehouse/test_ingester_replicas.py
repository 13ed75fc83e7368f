"""Two warehouse ingesters on the same durable consumers (replicas), one dying after an insert.

Embedded chdb allows one process per data path, so two ingester *processes* cannot share one
embedded warehouse: replicas on several hosts write to a ClickHouse server
(AGENTRL_CLICKHOUSE_URL), where each replica's inserts land in the same ReplacingMergeTree
tables. What that needs is tested here with real parts: two ingester services, each on its
own NATS connection, share the durables and one real chdb warehouse; one dies right after an
insert, before its acks (its whole service stops and its connection closes); the server
redelivers its unacked batch to the other, which inserts those rows a second time, and the
table keys collapse them: the counts come out exact.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agentrl.bus import Bus, EmbeddedNats
from agentrl.core.settings import Settings
from agentrl.warehouse import samples as S
from agentrl.warehouse.backend import Backend
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.queries import Analytics
from agentrl.warehouse.service import IngesterService


class Died(BaseException):
    """The replica's process ending between an insert and its acks (not an Exception: the
    bus does not turn it into a nak, it ends the consumer the way a kill does)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    srv = EmbeddedNats(data_dir=tmp_path_factory.mktemp("warehouse-replicas-nats"))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture()
async def bus(server: EmbeddedNats) -> AsyncIterator[Bus]:
    b = await Bus.connect(server.url)
    await b.ensure_streams()
    for stream in ("RL_TRAJECTORIES", "RL_REWARDS", "RL_DLQ"):
        await b.js.purge_stream(stream)
    yield b
    await b.close()


async def pending(bus: Bus, prefix: str) -> int:
    total = 0
    for stream, kind in (("RL_TRAJECTORIES", "trajectory"), ("RL_REWARDS", "reward")):
        info = await bus.js.consumer_info(stream, f"{prefix}-{kind}")
        total += info.num_pending + info.num_ack_pending
    return total


async def test_two_ingesters_one_dies_after_an_insert_rows_stay_exact(
    bus: Bus,
    server: EmbeddedNats,
    backend: Backend,
    wsettings: WarehouseSettings,
    tmp_path: Path,
) -> None:
    n = 3000
    prefix = f"whr-{uuid.uuid4().hex[:6]}"
    ws = wsettings.model_copy(
        update={"durable_prefix": prefix, "batch_size": 200, "ack_wait_s": 2.0}
    )
    events: list[object] = []
    for i in range(n):
        events += [S.trajectory(40_000 + i), S.reward(40_000 + i, (i % 10) / 10)]
    inserts = {"a": 0}

    def a_inserted(kind: str, _count: int) -> None:
        if kind == "trajectory":
            inserts["a"] += 1
            if inserts["a"] == 3:  # the rows are stored; the acks will never be sent
                raise Died()

    buses = {name: await Bus.connect(server.url, name=f"ingester-{name}") for name in "ab"}
    services = {
        "a": IngesterService(
            buses["a"], Settings(data_dir=tmp_path), ws, backend=backend, on_inserted=a_inserted
        ),
        "b": IngesterService(buses["b"], Settings(data_dir=tmp_path), ws, backend=backend),
    }
    stops = {name: asyncio.Event() for name in services}
    tasks = {name: asyncio.create_task(s.run(stops[name])) for name, s in services.items()}
    try:
        for k in range(0, len(events), 2000):
            await bus.publish_many(events[k : k + 2000])  # type: ignore[arg-type]
        with pytest.raises(Died):
            await asyncio.wait_for(tasks["a"], 120)
        await buses["a"].nc.close()  # what a killed process leaves: no acks, no connection
        deadline = time.monotonic() + 120
        while await pending(bus, prefix) > 0:
            assert not tasks["b"].done(), tasks["b"]
            assert time.monotonic() < deadline, f"{await pending(bus, prefix)} still pending"
            await asyncio.sleep(0.2)
    finally:
        for stop in stops.values():
            stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 30)
        await buses["b"].close()
    a, b = (services[x].status.events["trajectory"] for x in "ab")
    assert a > 0 and b > 0  # both replicas ingested
    assert a + b > n  # the dead replica's last batch was inserted again by the other
    counts = Analytics(backend, ws.database).counts()
    assert (counts["trajectories"], counts["turns"], counts["rewards"]) == (n, 3 * n, n)
    assert await bus.dead_letters() == []


CHILD = str(Path(__file__).with_name("_child.py"))


def child(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, CHILD, *args], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )


def counts(env: dict[str, str]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, CHILD, "count"], env=env, capture_output=True, timeout=60, check=True
    )
    return json.loads(out.stdout.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


async def test_two_ingester_processes_on_one_chdb_path_one_takes_over(
    bus: Bus, server: EmbeddedNats, tmp_path: Path
) -> None:
    """Two ingester processes given the same embedded data path (`agentrl up --replicas 2`
    on one data dir): one owns chdb, the other stands by; SIGKILL the owner mid-stream and
    the other opens the path, takes the unacked batches and the counts come out exact."""
    # 3,000 (1,500 per half, batches of 500): the owner inserts twice before the kill and the
    # standby has the second half to take over whatever the speed; 6,000 checked the same
    n = 3000
    env = {
        **os.environ,
        "AGENTRL_WAREHOUSE_PATH": str(tmp_path / "chdb"),
        "AGENTRL_CLICKHOUSE_DATABASE": "replicas",
        "AGENTRL_WAREHOUSE_DURABLE_PREFIX": f"whp-{uuid.uuid4().hex[:6]}",
        "AGENTRL_WAREHOUSE_BATCH_SIZE": "500",
        "AGENTRL_WAREHOUSE_ACK_WAIT_S": "2",
    }
    logs = {x: tmp_path / f"{x}.log" for x in "ab"}
    procs = {x: child(["ingest", server.url, "0"], env, logs[x]) for x in "ab"}
    try:
        events: list[object] = []
        for i in range(n):
            events += [S.trajectory(60_000 + i), S.reward(60_000 + i, (i % 10) / 10)]
        half = len(events) // 2
        for k in range(0, half, 2000):
            await bus.publish_many(events[k : min(k + 2000, half)])  # type: ignore[arg-type]
        deadline = time.monotonic() + 120
        active = None
        while active is None:  # the owner is the one inserting
            for x in "ab":
                assert procs[x].poll() is None, logs[x].read_text()
                if "inserted batch 2 " in logs[x].read_text():
                    active = x
            assert time.monotonic() < deadline, "no ingester inserted anything"
            await asyncio.sleep(0.05)
        standby = "b" if active == "a" else "a"
        procs[active].send_signal(signal.SIGKILL)
        procs[active].wait(10)
        # the second half arrives after the kill: the standby has work whatever the speed
        for k in range(half, len(events), 2000):
            await bus.publish_many(events[k : k + 2000])  # type: ignore[arg-type]
        while await pending(bus, env["AGENTRL_WAREHOUSE_DURABLE_PREFIX"]) > 0:
            assert procs[standby].poll() is None, logs[standby].read_text()
            assert time.monotonic() < deadline, "the standby never took over"
            await asyncio.sleep(0.2)
        assert "inserted batch" in logs[standby].read_text()  # the standby did take over
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(30)
    assert counts(env) == {
        "trajectories": n,
        "turns": 3 * n,
        "rewards": n,
        "feedback": 0,
        "training_jobs": 0,
        "deployments": 0,
        "model_versions": 0,
    }
