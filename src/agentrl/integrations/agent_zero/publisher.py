"""Publishing from inside Agent Zero: redact, spool, then flush within a time budget.

The agent must never wait on NATS for long: `Outbox.send` writes the events to the spool
(milliseconds) and then gives the flush `publish_timeout_s` (default 2 s) in all, connect
included; whatever is left stays spooled for the next flush (the next monologue's start or
end, or `agentrl agent-zero flush`). A server that refuses connections is found out by a TCP
probe in milliseconds (nats-py's own first connect keeps retrying); one that does not answer
at all costs one budget, then flushes are skipped for a growing pause (5 s doubling to 60 s),
so a blackholed NATS slows a monologue at most once per pause. Nothing here raises into
Agent Zero's loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlparse

from agentrl.contracts.base import Event
from agentrl.contracts.streams import STREAMS
from agentrl.integrations.agent_zero.config import AgentZeroConfig
from agentrl.integrations.agent_zero.spool import Spool

log = logging.getLogger("agentrl.agent_zero")


def redacted(event: Event) -> Event:
    """The event with PII replaced (agentrl.rewards.redact, the reward service's patterns);
    the same object when nothing was found."""
    from agentrl.rewards.redact import redact_event

    clean, counts = redact_event(event)
    if counts:
        log.info("agentrl: redacted %s in %s", dict(counts), event.SUBJECT)
    out: Event = clean
    return out


def permanent(exc: BaseException) -> bool:
    """An error publishing one event that no retry can cure (too large, a bad request)."""
    import nats.errors
    import nats.js.errors

    from agentrl.core.errors import PayloadTooLargeError

    if isinstance(exc, PayloadTooLargeError | nats.errors.MaxPayloadError):
        return True
    return isinstance(exc, nats.js.errors.APIError) and exc.code in (400, 413)


async def probe(servers: list[str], timeout: float) -> None:
    """Fail fast when no server accepts a TCP connection (nats-py's own first connect
    keeps retrying)."""
    errors = []
    for server in servers:
        url = urlparse(server if "://" in server else f"nats://{server}")
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(url.hostname or "127.0.0.1", url.port or 4222), timeout
            )
        except OSError as exc:
            errors.append(f"{server}: {exc.strerror or exc}")
            continue
        writer.close()
        return
    raise ConnectionRefusedError("NATS unreachable (" + "; ".join(errors) + ")")


class Outbox:
    def __init__(self, config: AgentZeroConfig) -> None:
        self.config = config
        self.spool = Spool(config.spool_path())
        self.streams_ready = False
        self.last_error: str | None = None
        self.pause_s = 0.0  # after a flush that timed out: skip flushes until `retry_at`
        self.retry_at = 0.0
        self.set_aside = 0  # events NATS refused for good, moved aside (.bad) by this outbox

    def spool_events(self, events: Iterable[Event]) -> None:
        """Write `events` to the spool (redacted unless configured off); no network."""
        for event in events:
            if self.config.redact:
                event = redacted(event)
            self.spool.put(event)

    async def send(self, events: Iterable[Event]) -> int:
        """Spool `events` and try to flush; returns how many spooled events were
        published now."""
        self.spool_events(events)
        return await self.flush()

    async def flush(self, timeout: float | None = None, *, force: bool = False) -> int:
        """Publish spooled events oldest first, for at most `timeout` seconds (`force`:
        even during the pause after a timed-out flush)."""
        if not len(self.spool):
            return 0
        if not force and time.monotonic() < self.retry_at:
            return 0
        sent = [0]
        try:
            await asyncio.wait_for(self._flush(sent), timeout or self.config.publish_timeout_s)
            self.last_error = None
            self.pause_s = self.retry_at = 0.0
        except Exception as exc:  # unreachable, timed out, no stream: stays spooled
            self.last_error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, TimeoutError | asyncio.TimeoutError):
                self.pause_s = min(60.0, max(5.0, self.pause_s * 2))
                self.retry_at = time.monotonic() + self.pause_s
            log.warning(
                "agentrl: %d event(s) stay spooled in %s (%s)",
                len(self.spool),
                self.spool.folder,
                self.last_error,
            )
        return sent[0]

    async def _probe(self, servers: list[str]) -> None:
        await probe(servers, self.config.connect_timeout_s)

    async def _flush(self, sent: list[int]) -> None:
        with self.spool.locked() as mine:
            if not mine:
                return  # another flusher is at it; it re-lists until the spool is empty
            bus = await self._connect()
            try:
                while batch := self.spool.pending():
                    for item in batch:
                        try:
                            await bus.publish_raw(item.subject, item.data, item.msg_id)
                        except Exception as exc:
                            if not permanent(exc):
                                raise  # stays spooled, in order
                            self._set_aside(item, exc)
                            continue
                        item.path.unlink(missing_ok=True)
                        sent[0] += 1
            finally:
                await bus.close()

    def _set_aside(self, item: Any, exc: Exception) -> None:
        reason = f"{type(exc).__name__}: {exc}"
        bad = self.spool.set_aside(item, reason)
        self.set_aside += 1
        log.error(
            "agentrl: %s (%d bytes) can never be published, moved aside to %s (%s); "
            "%d event(s) set aside in all",
            item.subject,
            len(item.data),
            bad,
            reason,
            self.spool.bad_count(),
        )

    async def _connect(self) -> Any:
        import nats

        from agentrl.bus import Bus

        async def quiet(exc: Exception) -> None:  # the warning above says it once
            log.debug("agentrl: NATS: %s", exc)

        options: dict[str, Any] = {}
        if self.config.nats_token:
            options["token"] = self.config.nats_token
        servers = [u.strip() for u in self.config.nats_url.split(",") if u.strip()]
        await self._probe(servers)
        nc = await nats.connect(
            servers=servers,
            name="agentrl-agent-zero",
            connect_timeout=self.config.connect_timeout_s,
            max_reconnect_attempts=0,
            allow_reconnect=False,
            error_cb=quiet,
            **options,
        )
        bus = Bus(nc, publish_timeout=self.config.publish_timeout_s, publish_retries=1)
        if not self.streams_ready:
            await bus.ensure_streams(STREAMS)
            self.streams_ready = True
        return bus
