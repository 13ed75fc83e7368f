"""Child process of the cross-process capture test: the control API (with its OTLP
receiver) in a process of its own, on the test's nats-server, as a replica beside the
gateway would run it. It has no gateway: the gateway's episodes live in the parent.

usage: python _api_child.py NATS_URL PORT DATA_DIR
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import uvicorn

from agentrl.app.api import create_app
from agentrl.bus import Bus
from agentrl.core.settings import Settings


async def main(url: str, port: int, data_dir: Path) -> None:
    bus = await Bus.connect(url, name="capture-api-child")
    app = create_app(Settings(data_dir=data_dir), bus)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    try:
        await uvicorn.Server(config).serve()
    finally:
        await bus.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
