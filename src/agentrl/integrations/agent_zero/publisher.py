"""Publishing from inside Agent Zero: redact, spool, then flush within a time budget.

The agent must never wait on NATS for long: `Outbox.send` writes the events to the spool
(milliseconds) and then gives the flush `publish_timeout_s` (default 2 s) in all, connect
included; whatever is left stays spooled for the next flush (the next monologue's start or
end, or `agentrl agent-zero flush`). Nothing here raises into Agent Zero's loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

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


class Outbox:
    def __init__(self, config: AgentZeroConfig) -> None:
        self.config = config
        self.spool = Spool(config.spool_path())
        self.streams_ready = False
        self.last_error: str | None = None

    async def send(self, events: Iterable[Event]) -> int:
        """Spool `events` (redacted unless configured off) and try to flush; returns how
        many spooled events were published now."""
        for event in events:
            if self.config.redact:
                event = redacted(event)
            self.spool.put(event)
        return await self.flush()

    async def flush(self, timeout: float | None = None) -> int:
        """Publish spooled events oldest first, for at most `timeout` seconds."""
        if not len(self.spool):
            return 0
        sent = [0]
        try:
            await asyncio.wait_for(self._flush(sent), timeout or self.config.publish_timeout_s)
            self.last_error = None
        except Exception as exc:  # unreachable, timed out, no stream: stays spooled
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "agentrl: %d event(s) stay spooled in %s (%s)",
                len(self.spool),
                self.spool.folder,
                self.last_error,
            )
        return sent[0]

    async def _flush(self, sent: list[int]) -> None:
        with self.spool.locked() as mine:
            if not mine:
                return  # another flusher is at it; it re-lists until the spool is empty
            bus = await self._connect()
            try:
                while batch := self.spool.pending():
                    for item in batch:
                        await bus.publish_raw(item.subject, item.data, item.msg_id)
                        item.path.unlink(missing_ok=True)
                        sent[0] += 1
            finally:
                await bus.close()

    async def _connect(self) -> Any:
        import nats

        from agentrl.bus import Bus

        async def quiet(exc: Exception) -> None:  # the warning above says it once
            log.debug("agentrl: NATS: %s", exc)

        options: dict[str, Any] = {}
        if self.config.nats_token:
            options["token"] = self.config.nats_token
        nc = await nats.connect(
            servers=[u.strip() for u in self.config.nats_url.split(",") if u.strip()],
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
