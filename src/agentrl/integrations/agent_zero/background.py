"""The plugin's own event loop, on a daemon thread: spooled events are published within
seconds even when nothing else runs.

A chat stopped, reset or removed is recorded from a synchronous Agent Zero call, often on a
web request's short-lived event loop (or none at all); a flush started there died with that
loop, and the abandoned monologue waited for the next chat. `kick(outbox)` hands the flush to
this loop instead: it publishes now, and while NATS is away it tries again with a growing
pause (1 s doubling to 30 s) until the spool is empty. At most two drains of one spool run
at once (its flush lock lets one publish; the second covers events spooled as the first
ends).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("agentrl.agent_zero")

FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_draining: dict[str, list[Future[Any]]] = {}
MAX_DRAINS = 2


def loop() -> asyncio.AbstractEventLoop:
    """The plugin's loop (started on first use, a daemon thread: never blocks an exit)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            new = asyncio.new_event_loop()
            thread = threading.Thread(
                target=new.run_forever, name="agentrl-a0-background", daemon=True
            )
            thread.start()
            _loop = new
        return _loop


async def _drain(outbox: Any) -> int:
    sent, pause = 0, FIRST_RETRY_S
    while len(outbox.spool):
        sent += await outbox.flush(force=True)
        if not len(outbox.spool):
            break
        await asyncio.sleep(pause)
        pause = min(MAX_RETRY_S, pause * 2)
    return sent


def kick(outbox: Any) -> Future[Any]:
    """Publish what `outbox`'s spool holds on the plugin's loop; returns the drain's future."""
    key = str(outbox.spool.folder)
    running_loop = loop()
    with _lock:
        running = [f for f in _draining.get(key, []) if not f.done()]
        if len(running) >= MAX_DRAINS:
            return running[-1]
        future = asyncio.run_coroutine_threadsafe(_drain(outbox), running_loop)
        _draining[key] = [*running, future]
    future.add_done_callback(_report)
    return future


def _report(future: Future[Any]) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        log.warning("agentrl: background flush failed: %s", exc)
