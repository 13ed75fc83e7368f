"""Garbage-collector and scheduler settings for a latency-bound server process (the gateway).

Why the collector: the gateway's process holds torch and the rest of the stack (about 220,000
tracked objects after start-up). A full collection walks all of them (110-160 ms measured at
real-time priority on the 2-core machine, 270 ms under load), and every request that arrives
meanwhile lands in the tail: at 1,000 requests/s one such pause is a hundred requests past
2 ms. `gc.freeze()` after start-up
moves what exists to the permanent generation, never scanned again; a larger youngest
generation makes the short pauses rarer. Reference counting and the collector still free
everything made afterwards.

Why the scheduler: on a shared host the gateway's tail is its event loop waiting for a core
(py-spy at 1,000 requests/s: a third of the loop's wall time inside `send`, with almost no
system CPU: each send wakes the receiver, the backend or the client, which takes the core).
Linux's EEVDF scheduler (6.12+) takes `sched_attr.sched_runtime` of an ordinary (fair-class)
thread as its slice: a short slice gives the loop an early deadline, so a woken task does not
preempt it mid-burst, and it gets a core back sooner when it wakes. Not real-time priority:
no privilege is needed, the thread keeps its fair share and nothing else's.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import platform
import struct
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from agentrl.core.gcstart import YOUNG, raise_young_generation

log = logging.getLogger(__name__)
T = TypeVar("T")

SLICE_US = 100  # a short slice (the kernel's floor; its default on the 2-core host: 1,400)
_SETATTR = {"x86_64": 314, "aarch64": 274}  # sched_setattr(2)'s syscall number
_ATTR = "IIQiIQQQII"  # struct sched_attr, SCHED_ATTR_SIZE_VER1 (56 bytes)


def settle(young: int = YOUNG, slice_us: int | None = None) -> None:
    """Call once start-up is done (imports, models loaded), from the event loop's thread:
    collect, then freeze; with `slice_us`, give that thread a short scheduler slice
    (`short_slice`; measured by `agentrl bench gateway --peers --only agentrl-slice`, not
    adopted by default)."""
    gc.collect()
    gc.freeze()
    raise_young_generation(young)
    if slice_us is not None:
        short_slice(slice_us)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run a server process's main coroutine (`agentrl up`, a replica) on uvloop when it is
    installed, else asyncio's loop; `AGENTRL_EVENT_LOOP=asyncio` asks for asyncio's.

    Why: the gateway's per-request work is mostly the event loop's own Python (handles,
    timers, transports: 172 -> 120 Python function calls per non-streamed request through
    the chat handler and the upstream pool), and in four side-by-side runs beside TensorZero
    (`agentrl bench gateway --peers --interleave 3`, uvloop then a variant beside asyncio's
    loop; now `agentrl-asyncio` is the variant), load 9-16 on 2 cores, the added p99 at 200
    requests/s was lower under uvloop in every run."""
    if os.environ.get("AGENTRL_EVENT_LOOP", "").lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main)  # type: ignore[no-any-return]
    return asyncio.run(main)


def short_slice(slice_us: int = SLICE_US) -> bool:
    """Ask the scheduler for a `slice_us` slice for the calling thread (fair class, its nice
    kept). False where the kernel or platform does not take it (then nothing changed)."""
    number = _SETATTR.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return False
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        attr = struct.pack(_ATTR, 56, 0, 0, nice, 0, slice_us * 1000, 0, 0, 0, 0)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(number, 0, ctypes.c_char_p(attr), 0) != 0:
            err = ctypes.get_errno()
            log.info("scheduler slice not set: %s", os.strerror(err))
            return False
    except (OSError, AttributeError) as exc:
        log.info("scheduler slice not set: %s", exc)
        return False
    return True


def current_slice_us() -> int | None:
    """The calling thread's scheduler slice in microseconds (Linux 6.12+), else None."""
    number = _SETATTR.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return None
    buf = ctypes.create_string_buffer(56)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number + 1, 0, buf, 56, 0) != 0:  # sched_getattr: the next number
        return None
    return int(struct.unpack(_ATTR, buf.raw)[5] // 1000)
