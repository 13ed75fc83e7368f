"""`until_stopped`: a service awaiting work on a thread (a cold model load) still stops when
asked, instead of holding `agentrl up` past SIGINT for the stack's whole stop grace."""

from __future__ import annotations

import asyncio
import threading
import time

from agentrl.core.supervision import until_stopped


async def test_work_on_a_thread_is_let_go_when_stop_is_set() -> None:
    stop = asyncio.Event()
    release = threading.Event()
    asyncio.get_running_loop().call_later(0.2, stop.set)
    t0 = time.monotonic()
    got = await until_stopped(asyncio.to_thread(release.wait, 30), stop)
    assert got is None and time.monotonic() - t0 < 5
    release.set()  # the thread itself ends when its work does


async def test_the_result_or_the_error_of_work_that_ends_first() -> None:
    stop = asyncio.Event()
    assert await until_stopped(asyncio.to_thread(lambda: 7), stop) == 7

    async def fails() -> None:
        raise ValueError("bad record")

    try:
        await until_stopped(fails(), stop)
    except ValueError as exc:
        assert "bad record" in str(exc)
    else:
        raise AssertionError("the error was swallowed")
