"""How many torch threads the local engine's forward passes use, from what the host's other
processes use right now.

Why: one thread was the safe choice on a shared host (OpenMP workers spinning against a
training job made decoding 7-30x slower on 2 busy cores, `local.engine_threads`), but while
the loop's agents act nothing else needs the cores, and one thread left half the machine
idle (the acting benchmark's process used 0.77 of 2 cores). `CoreGovernor` reads the host's
busy time (/proc/stat) and this process's own CPU time every `interval_s` and gives forward
passes the cores the other processes left (`threads_for`): on 2 cores, two threads while the
others used under 0.35 of a core, one as soon as they use more (set per forward pass, on the
thread that runs it). Where /proc/stat cannot be read it keeps the least.

Two threads change the last bits of some kernels' sums (SmolLM2 with the light warm start,
16 replies under the reply schema: the same tokens, log-probs within 6e-6); one thread is
the engine's exact reference.
"""

from __future__ import annotations

import os
import threading
import time

import torch

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def host_busy_s() -> float | None:
    """Seconds of CPU time all processes used since boot (None where unreadable)."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields[:8]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / CLOCK_TICKS


_LAST_USE: dict[int, float] = {}  # governor -> when it last gave a forward pass threads


def threads_for(others: float, cores: int, least: int, most: int, slack: float = 0.35) -> int:
    """Threads for a forward pass when the other processes use `others` cores of `cores`:
    the cores they leave, counting one they use less than `slack` of as free, within
    [least, most]."""
    return max(least, min(most, int(cores - others + slack)))


class CoreGovernor:
    """`threads()`: the torch threads a forward pass may use now (re-decided at most every
    `interval_s`; cheap to call per forward pass)."""

    def __init__(
        self,
        least: int,
        most: int,
        *,
        cores: int | None = None,
        interval_s: float = 1.0,
        slack: float = 0.35,
    ) -> None:
        self.least = max(1, int(least))
        self.most = max(self.least, int(most))
        self.cores = int(cores or os.cpu_count() or 1)
        self.interval_s = interval_s
        self.slack = slack
        self.current = self.least
        self.others = 0.0  # cores the other processes used in the last interval
        self.switches = 0
        self._lock = threading.Lock()
        self._at = time.monotonic()
        self._host = host_busy_s()
        self._own = time.process_time()

    def threads(self) -> int:
        if self.most == self.least or self._host is None:
            return self.least
        now = time.monotonic()
        _LAST_USE[id(self)] = now
        if any(g != id(self) and now - t < 2 * self.interval_s for g, t in _LAST_USE.items()):
            # another engine of this process decodes too (a validation beside the gateway):
            # its threads are this process's own time, invisible to the others' count
            return self.least
        if now - self._at < self.interval_s:
            return self.current
        with self._lock:
            if now - self._at < self.interval_s:
                return self.current
            host, own = host_busy_s(), time.process_time()
            if host is None:
                self.current = self.least
                return self.current
            wall = now - self._at
            self.others = max(0.0, (host - self._host) - (own - self._own)) / wall
            self._at, self._host, self._own = now, host, own
            want = threads_for(self.others, self.cores, self.least, self.most, self.slack)
            if want != self.current:
                self.current, self.switches = want, self.switches + 1
            return self.current

    def apply(self) -> int:
        """Set the calling thread's torch threads to `threads()` (OpenMP's count is per
        thread: the thread that runs the forward pass sets it)."""
        n = self.threads()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        return n
