"""The ingester core: a fetched batch of events -> columnar inserts -> one outcome per event.

Acks happen only after the insert returned (the bus acks when the batch handler returns);
a crash between insert and ack redelivers events whose rows are already stored, and the
ReplacingMergeTree keys collapse them (queries read with FINAL / argMax, so counts are exact
before any merge). An event whose values do not fit the schema, or whose rows the engine
refuses (found by splitting the failed insert in halves), is dead-lettered with the reason
while the rest of its batch goes in. A warehouse that is down holds the batch and retries
with exponential backoff (the bus keeps the messages in progress), then naks it; nothing is
acked and nothing is dead-lettered for an outage, and `status` says what is wrong.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from agentrl.bus import Delivery, PermanentError, TransientError
from agentrl.contracts.subjects import FEEDBACK, MODEL_DEPLOYED, REWARD, TRAINING_STATUS, TRAJECTORY
from agentrl.observability import instrument as obs
from agentrl.warehouse import rows
from agentrl.warehouse.backend import Backend, WarehouseDataError, WarehouseDown

log = logging.getLogger(__name__)

SUBJECT_KINDS: dict[str, str] = {
    TRAJECTORY: "trajectory",
    REWARD: "reward",
    FEEDBACK: "feedback",
    TRAINING_STATUS: "training_status",
    MODEL_DEPLOYED: "deployment",
}


@dataclass
class IngestStatus:
    """What the ingester reports (control API `/stats/ingester`, `agentrl up`'s panel)."""

    backend: str = ""
    state: str = "starting"  # starting | up | down | standby | stopped | failed
    last_error: str | None = None
    down_since: float | None = None
    last_insert_at: float | None = None
    batches: int = 0
    retries: int = 0
    nakked_batches: int = 0
    events: Counter[str] = field(default_factory=Counter)
    rows: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "state": self.state,
            "last_error": self.last_error,
            "down_for_s": None if self.down_since is None else time.time() - self.down_since,
            "last_insert_at": self.last_insert_at,
            "batches": self.batches,
            "retries": self.retries,
            "nakked_batches": self.nakked_batches,
            "events": dict(self.events),
            "rows": dict(self.rows),
            "rejected": dict(self.rejected),
            "skipped": dict(self.skipped),
        }


def insert_built(backend: Backend, database: str, built: rows.Built) -> dict[int, str]:
    """Insert every table of `built`; returns {delivery index: reason} of what was refused.

    Raises WarehouseDown when the warehouse cannot take the insert at all."""
    bad = dict(built.rejected)
    for table_rows in built.tables:
        owners = [o for o in table_rows.owners if o not in bad]
        if not owners:
            continue
        table = table_rows.to_arrow((lambda o: o not in bad) if bad else None)
        started = time.perf_counter()
        bad.update(_insert_narrowing(backend, f"{database}.{table_rows.name}", table, owners))
        obs.warehouse_insert(table_rows.name, table.num_rows, time.perf_counter() - started)
    return bad


def _insert_narrowing(
    backend: Backend, name: str, table: pa.Table, owners: Sequence[int]
) -> dict[int, str]:
    """Insert; on a data error split the events in halves until the bad ones are isolated
    (inserting a half twice is harmless: the keys collapse it)."""
    try:
        backend.insert(name, table)
        return {}
    except WarehouseDataError as exc:
        distinct = sorted(set(owners))
        if len(distinct) == 1:
            return {distinct[0]: f"rejected by the warehouse ({name}): {exc}"}
        half = set(distinct[: len(distinct) // 2])
        mask = [o in half for o in owners]
        left = table.filter(pa.array(mask))
        right = table.filter(pa.array([not m for m in mask]))
        found = _insert_narrowing(backend, name, left, [o for o in owners if o in half])
        found.update(_insert_narrowing(backend, name, right, [o for o in owners if o not in half]))
        return found


def msg_id_of(delivery: Delivery) -> str:
    headers = delivery.msg.headers or {}
    return headers.get("Nats-Msg-Id") or hashlib.sha256(delivery.data).hexdigest()


class Ingester:
    """Turns batches of deliveries into inserts; one instance serves every subject."""

    def __init__(
        self,
        backend: Backend,
        database: str,
        *,
        backoff_max_s: float = 30.0,
        down_hold_s: float = 20.0,
        on_inserted: Callable[[str, int], None] | None = None,
    ) -> None:
        self.backend = backend
        self.database = database
        self.backoff_max_s = backoff_max_s
        self.down_hold_s = down_hold_s
        self.on_inserted = on_inserted
        self.status = IngestStatus(backend=backend.name)
        self.stop = asyncio.Event()

    def mark_down(self, exc: BaseException) -> None:
        if self.status.state != "down":
            log.warning("warehouse is down (%s): holding batches and retrying", exc)
            self.status.down_since = time.time()
        self.status.state = "down"
        self.status.last_error = str(exc)

    def mark_up(self) -> None:
        if self.status.state == "down":
            log.info("warehouse is back after %.1fs", time.time() - (self.status.down_since or 0))
        self.status.state = "up"
        self.status.down_since = None

    async def handle(self, kind: str, deliveries: list[Delivery]) -> list[BaseException | None]:
        items = [(d.event, d.data, msg_id_of(d)) for d in deliveries]
        built = rows.build(kind, items, int(time.time() * 1000))
        delay, held = 0.25, 0.0
        while True:
            try:
                bad = await asyncio.to_thread(insert_built, self.backend, self.database, built)
                break
            except WarehouseDown as exc:
                self.mark_down(exc)
                if self.stop.is_set() or held >= self.down_hold_s:
                    self.status.nakked_batches += 1
                    return [TransientError(f"warehouse down: {exc}")] * len(deliveries)
                self.status.retries += 1
                await asyncio.sleep(delay)
                held += delay
                delay = min(delay * 2, self.backoff_max_s)
        self.mark_up()
        st = self.status
        st.batches += 1
        st.last_insert_at = time.time()
        st.events[kind] += len(deliveries) - len(bad) - len(built.skipped)
        for reason in built.skipped.values():
            st.skipped[reason] += 1
        for table_rows in built.tables:
            st.rows[table_rows.name] += sum(1 for o in table_rows.owners if o not in bad)
        if bad:
            st.rejected[kind] += len(bad)
            for i, reason in bad.items():
                log.warning("dead-lettering %s %s: %s", kind, items[i][2], reason)
        if self.on_inserted is not None:
            self.on_inserted(kind, len(deliveries))
        return [PermanentError(bad[i]) if i in bad else None for i in range(len(deliveries))]
