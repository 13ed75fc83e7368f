"""The embedded stack behind `agentrl up`: nats-server, streams, and the services.

A service is `async def serve(bus, stop, settings) -> None` that runs until `stop` is set;
SERVICES names them by import path so this module needs none of them to import.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from rich.console import Console

from agentrl.bus.client import Bus
from agentrl.bus.server import EmbeddedNats
from agentrl.settings import Settings, get_settings

log = logging.getLogger(__name__)

SERVICES: tuple[tuple[str, str], ...] = (
    ("reward service", "agentrl.rewards.service:serve"),
    ("warehouse ingester", "agentrl.warehouse.service:serve"),
    ("training service", "agentrl.training.service:serve"),
    ("deployment controller", "agentrl.deploy.service:serve"),
    ("control API", "agentrl.api:serve"),
)

Serve = Callable[[Bus, asyncio.Event, Settings], Coroutine[Any, Any, None]]


def load_services() -> list[tuple[str, Serve]]:
    found: list[tuple[str, Serve]] = []
    for label, path in SERVICES:
        module_name, attr = path.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        found.append((label, getattr(module, attr)))
    return found


async def serve_all(url: str, settings: Settings, services: bool, console: Console) -> None:
    bus = await Bus.connect(url, settings=settings, name="agentrl-up")
    await bus.ensure_streams()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    tasks: list[asyncio.Task[Any]] = []
    if services:
        for label, serve in load_services():
            console.print(f"[green]started[/] {label}")
            tasks.append(asyncio.create_task(serve(bus, stop, settings), name=label))
    console.print("[bold]agentrl is up.[/] Ctrl-C stops it.")
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    for task in tasks:
        if task in done and task.exception():
            console.print(f"[red]{task.get_name()} stopped:[/] {task.exception()}")
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
    await bus.close()
    console.print("stopped cleanly")


def run_stack(data_dir: str | None = None, port: int | None = None, services: bool = True) -> None:
    settings = get_settings()
    if data_dir:
        settings = settings.model_copy(update={"data_dir": Path(data_dir)})
    console = Console()
    if settings.nats_url:
        console.print(f"using NATS at [bold]{settings.nats_url}[/] (NATS_URL)")
        asyncio.run(serve_all(settings.nats_url, settings, services, console))
        return
    with EmbeddedNats(settings=settings, port=port) as server:
        console.print(
            f"nats-server with JetStream listening on [bold]{server.url}[/]\n"
            f"  store: {server.store_dir}\n  log:   {server.log_file}\n"
            f"  export NATS_URL={server.url}  # for other shells"
        )
        asyncio.run(serve_all(server.url, settings, services, console))
