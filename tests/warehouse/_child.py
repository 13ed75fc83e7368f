"""Child processes of the crash test: an ingester that SIGKILLs itself right after its N-th
trajectory insert (before the bus acks it), and a reader that prints the counts.

usage: python _child.py ingest NATS_URL KILL_AFTER | python _child.py count
(warehouse path and database from AGENTRL_WAREHOUSE_PATH / AGENTRL_CLICKHOUSE_DATABASE)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from agentrl.bus import Bus
from agentrl.core.settings import Settings
from agentrl.warehouse.backend import WarehouseLocked, open_backend
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.queries import Analytics
from agentrl.warehouse.service import IngesterService


async def ingest(url: str, kill_after: int) -> None:
    inserted = {"n": 0}

    def on_inserted(kind: str, _count: int) -> None:
        if kind == "trajectory":
            inserted["n"] += 1
            inserted["events"] = inserted.get("events", 0) + _count
            print(f"inserted batch {inserted['n']} ({inserted['events']} trajectories)", flush=True)
            if inserted["n"] == kill_after:  # the rows are stored, the acks not yet sent
                os.kill(os.getpid(), signal.SIGKILL)

    bus = await Bus.connect(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    service = IngesterService(bus, Settings(data_dir=Path(".")), on_inserted=on_inserted)
    await service.run(stop)
    await bus.close()


def count() -> None:
    ws = WarehouseSettings()
    try:
        backend = open_backend(ws, Path("."))
    except WarehouseLocked as exc:
        print(json.dumps({"locked": str(exc)}))
        return
    print(json.dumps(Analytics(backend, ws.database).counts()))


if __name__ == "__main__":
    if sys.argv[1] == "ingest":
        asyncio.run(ingest(sys.argv[2], int(sys.argv[3])))
    else:
        count()
