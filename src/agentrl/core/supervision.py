"""Supervision inside one service: a loop that survives transient errors, and a set of inner
tasks that fails as a whole when one of them dies.

Why: a service's inner task (a consumer, a tracker, an HTTP server) that ended with an
exception used to end silently while the service, `/health` and the panel still said
"running". `keep_running` retries an inner loop with backoff (a nats-server away for a while
is ordinary); when it keeps failing, or any inner task ends early, `run_tasks` cancels the
others and raises, so the stack's supervisor restarts the service and shows the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


class InnerTaskFailed(RuntimeError):
    """An inner task of a service died (or returned before the service was stopped)."""


async def keep_running(
    name: str,
    loop: Callable[[], Awaitable[Any]],
    stop: asyncio.Event,
    *,
    backoff: tuple[float, ...] = BACKOFF_S,
    max_failures: int = 6,
) -> None:
    """Run `loop()` until `stop`; an exception restarts it after a growing delay. After
    `max_failures` in a row (none of the runs lasted a minute) the last error is raised."""
    failures = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            await loop()
            if stop.is_set():
                return
            raise InnerTaskFailed(f"{name} returned before the service stopped")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures = 1 if time.monotonic() - started > 60 else failures + 1
            if failures >= max_failures:
                raise InnerTaskFailed(
                    f"{name} failed {failures} times in a row: {type(exc).__name__}: {exc}"
                ) from exc
            delay = backoff[min(failures - 1, len(backoff) - 1)]
            log.warning("%s failed (%s); retrying in %.1f s", name, exc, delay, exc_info=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


async def until_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None as soon as `stop` is set (`work` is cancelled then). Why: an
    await on a thread (a cold model load: tens of seconds of GGUF conversion) does not see
    `stop`, and a service waiting in it held `agentrl up` past SIGINT for the stack's whole
    stop grace; the thread itself runs on, unwaited (`app.stack.exit_past_stragglers`)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return None if task.cancelled() else task.result()


async def run_tasks(
    coros: dict[str, Coroutine[Any, Any, Any]], stop: asyncio.Event, grace_s: float = 15.0
) -> None:
    """Run the named coroutines until `stop`. If one raises or returns before `stop`, the
    others are stopped and `InnerTaskFailed` (with the cause) is raised; on `stop` they get
    `grace_s` to finish, then are cancelled."""
    tasks = {asyncio.create_task(c, name=n): n for n, c in coros.items()}
    waiter = asyncio.create_task(stop.wait())
    failure: InnerTaskFailed | None = None
    try:
        done, _ = await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is waiter or stop.is_set():
                continue
            exc = task.exception()
            name = tasks[task]
            failure = InnerTaskFailed(
                f"{name}: {type(exc).__name__}: {exc}"
                if exc is not None
                else f"{name} returned before the service stopped"
            )
            failure.__cause__ = exc
            break
    finally:
        waiter.cancel()
        if failure is not None or not stop.is_set():
            for task in tasks:
                task.cancel()
        pending = [t for t in tasks if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5)
    if failure is not None:
        raise failure
