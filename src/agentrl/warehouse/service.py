"""The warehouse ingester service (`agentrl up` runs it): JetStream -> ClickHouse.

Durable pull consumers on trajectories, rewards, feedback, training status and deployment
events; each fetched batch (bounded by `batch_size` events and `batch_timeout_s`) becomes
columnar inserts (see `ingest`). On start it applies the schema migrations; a schema newer
than this code stops the service with a clear message, a warehouse that cannot be reached
is retried with backoff while the status says so.

Replicas: with a ClickHouse server, N ingesters (any hosts, same settings) share the durable
consumers and insert into the same tables, whose ReplacingMergeTree keys collapse what a
dead replica inserted but never acked. Embedded chdb is one process per data path: an
ingester that finds the path owned by another process stands by (state "standby") and
opens it within `standby_poll_s` of that process's exit, so N replicas on one data dir
give one active ingester and N-1 ready to take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.bus import Bus, ConsumeStats
from agentrl.core.settings import Settings, get_settings
from agentrl.warehouse import schema
from agentrl.warehouse.backend import (
    Backend,
    SchemaTooNew,
    WarehouseDown,
    WarehouseLocked,
    open_backend,
)
from agentrl.warehouse.config import WarehouseSettings
from agentrl.warehouse.ingest import SUBJECT_KINDS, Ingester, IngestStatus

log = logging.getLogger(__name__)

# The ingester service running in this process, for the control API's /stats/ingester.
current: IngesterService | None = None


class IngesterService:
    """Opens the warehouse, migrates it, and runs one consumer per subject until stopped."""

    def __init__(
        self,
        bus: Bus,
        settings: Settings | None = None,
        wsettings: WarehouseSettings | None = None,
        *,
        backend: Backend | None = None,
        on_inserted: Callable[[str, int], None] | None = None,
        max_deliver: int = 10_000,
        nak_delay: float = 5.0,
        down_hold_s: float = 20.0,
        standby_poll_s: float = 2.0,
    ) -> None:
        self.bus = bus
        self.settings = settings or get_settings()
        self.wsettings = wsettings or WarehouseSettings()
        self._backend = backend
        self.on_inserted = on_inserted
        self.max_deliver = max_deliver
        self.nak_delay = nak_delay
        self.down_hold_s = down_hold_s
        self.standby_poll_s = standby_poll_s
        self.status = IngestStatus(backend=self.wsettings.backend_name)
        self.consume_stats: dict[str, ConsumeStats] = {}
        self.ingester: Ingester | None = None

    def _open(self) -> Backend:
        if self._backend is None:
            self._backend = open_backend(self.wsettings, Path(self.settings.data_dir))
        return self._backend

    async def _ready(self, stop: asyncio.Event) -> Backend | None:
        """Open and migrate the warehouse, retrying with backoff while it is down."""
        delay = 0.5
        while not stop.is_set():
            try:
                backend = await asyncio.to_thread(self._open)
                if self.wsettings.migrate:
                    did = await asyncio.to_thread(schema.apply, backend, self.wsettings)
                    for line in did:
                        log.info("warehouse schema: %s", line)
                return backend
            except SchemaTooNew:
                self.status.state = "failed"
                raise
            except WarehouseLocked as exc:  # another replica's ingester owns the chdb path
                if self.status.state != "standby":
                    log.info("warehouse owned by another process: standing by (%s)", exc)
                self.status.state = "standby"
                self.status.last_error = str(exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.standby_poll_s)
            except WarehouseDown as exc:
                self.status.state = "down"
                self.status.last_error = str(exc)
                log.warning("warehouse not reachable (%s); retrying in %.1fs", exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, self.wsettings.backoff_max_s)
        return None

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; `/stats/ingester` reports this service meanwhile."""
        global current
        current = self
        try:
            await self._run(stop)
        finally:
            if current is self:
                current = None

    async def _run(self, stop: asyncio.Event) -> None:
        backend = await self._ready(stop)
        if backend is None:
            return
        ingester = Ingester(
            backend,
            self.wsettings.database,
            backoff_max_s=self.wsettings.backoff_max_s,
            down_hold_s=self.down_hold_s,
            on_inserted=self.on_inserted,
        )
        ingester.stop = stop
        ingester.status.state = "up"
        self.ingester, self.status = ingester, ingester.status
        tasks = []
        for subject, kind in SUBJECT_KINDS.items():
            stats = self.consume_stats.setdefault(kind, ConsumeStats())
            tasks.append(
                asyncio.create_task(
                    self.bus.consume(
                        subject,
                        f"{self.wsettings.durable_prefix}-{kind.replace('_', '-')}",
                        batch_handler=_bind(ingester, kind),
                        batch=self.wsettings.batch_size,
                        fetch_timeout=self.wsettings.batch_timeout_s,
                        ack_wait=self.wsettings.ack_wait_s,
                        max_deliver=self.max_deliver,
                        nak_delay=self.nak_delay,
                        stop=stop,
                        stats=stats,
                    ),
                    name=f"warehouse-{kind}",
                )
            )
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            ingester.status.state = "stopped"


def _bind(ingester: Ingester, kind: str) -> Any:
    async def handle(deliveries: list[Any]) -> list[BaseException | None]:
        return await ingester.handle(kind, deliveries)

    return handle


async def serve(bus: Bus, stop: asyncio.Event, settings: Settings) -> None:
    """`agentrl up`'s warehouse ingester: runs until `stop` is set."""
    await IngesterService(bus, settings).run(stop)
