"""Child process of the corrections test (chdb allows one data path per process): runs the
warehouse ingester from the bus into AGENTRL_WAREHOUSE_PATH until every named trajectory's
latest reward is at the wanted version, then prints the clickhouse dataset source's loader
output (`warehouse.export.clickhouse_load_data`, what a job with `source: clickhouse` reads)
and the feedback rows' corrections as one JSON line.

usage: python _warehouse_child.py NATS_URL VERSION TRAJECTORY_ID...
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from agentrl.bus import Bus
from agentrl.contracts.training import Dataset
from agentrl.core.settings import Settings
from agentrl.warehouse.backend import open_backend
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.export import clickhouse_load_data, select_dataset
from agentrl.warehouse.service import IngesterService


async def main(url: str, version: int, wanted: list[str]) -> None:
    ws = WarehouseSettings()
    settings = Settings(data_dir=Path("."))
    backend = open_backend(ws, ws.path or Path("."))
    bus = await Bus.connect(url)
    stop = asyncio.Event()
    service = IngesterService(bus, settings, ws, backend=backend)
    task = asyncio.create_task(service.run(stop))
    deadline = time.monotonic() + 90
    while True:
        await asyncio.sleep(0.3)
        try:
            table = select_dataset(backend, ws.database)
        except Exception:  # not migrated yet
            continue
        got = dict(
            zip(
                table.column("trajectory_id").to_pylist(),
                table.column("reward_version").to_pylist(),
                strict=True,
            )
        )
        if all((got.get(t) or 0) >= version for t in wanted):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"the warehouse never held version {version} of {wanted}: {got}")
    fb = backend.query(f"SELECT trajectory_id, correction FROM {ws.database}.feedback").to_pylist()
    stop.set()
    await asyncio.wait_for(task, 30)
    await bus.close()
    data = clickhouse_load_data(Dataset(source="clickhouse"), settings)  # the shared backend
    print(json.dumps({"data": data, "feedback": fb}, default=str))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3:]))
