"""Run a function in a child process with a timeout that is really enforced.

Why a process: a Python thread cannot be stopped, so a sync reward function (or a linter)
that hangs would keep its thread (and the GIL share) forever; and a function that never
yields, run on the event loop, freezes every ack and heartbeat of the service. A forked
child is killed when its call overruns and a fresh one is forked for the next call.

The child is forked (not spawned) from the process that owns the function, so the function
needs no import path: closures, functions defined in tests or `__main__` all work. Arguments
and results travel through a pipe (pickled).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any


class WorkerTimeout(TimeoutError):
    """The call ran past its timeout; the worker was killed."""


class WorkerCrashed(RuntimeError):
    """The worker died during the call (killed by a signal, out of memory, ...)."""


def _serve(
    conn: multiprocessing.connection.Connection,
    fn: Callable[..., Any],
    parent_end: multiprocessing.connection.Connection,
) -> None:
    # The fork copied the parent's end of the pipe: close it, or the pipe never reaches EOF
    # when the parent dies, and the worker (holding the parent's listening sockets and file
    # locks) outlives it.
    parent_end.close()
    # Ctrl-C reaches the whole process group: the parent decides when workers stop. The
    # event loop's wakeup fd belongs to the parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    while True:
        try:
            args, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result: tuple[bool, Any] = (True, fn(*args, **kwargs))
        except BaseException as exc:
            result = (False, exc)
        try:
            conn.send(result)
        except Exception as exc:  # unpicklable result or exception
            conn.send((False, RuntimeError(f"{type(exc).__name__}: {exc}")))


class ForkedWorker:
    """One child process running `fn`; one call at a time."""

    def __init__(self, fn: Callable[..., Any], name: str = "worker") -> None:
        self.fn = fn
        self.name = name
        self._proc: Any = None
        self._conn: multiprocessing.connection.Connection | None = None
        self.starts = 0

    def _ensure(self) -> multiprocessing.connection.Connection:
        if self._proc is not None and self._proc.is_alive() and self._conn is not None:
            return self._conn
        self.close()
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_serve, args=(child, self.fn, parent), name=self.name, daemon=True
        )
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        self.starts += 1
        return parent

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None) -> Any:
        """`fn(*args, **kwargs)` in the child; raises what it raised, `WorkerTimeout` after
        `timeout` seconds (the child is killed), or `WorkerCrashed`."""
        conn = self._ensure()
        try:
            conn.send((args, kwargs))
            answered = conn.poll(timeout)
            if answered:
                ok, value = conn.recv()
        except (EOFError, OSError) as exc:  # OSError covers a broken pipe
            code = self._proc.exitcode if self._proc is not None else None
            self.kill()
            raise WorkerCrashed(f"{self.name} died (exit code {code}): {exc}") from exc
        if not answered:
            self.kill()
            raise WorkerTimeout(f"{self.name} ran past {timeout}s and was killed")
        if ok:
            return value
        raise value

    def kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._proc is not None and not self._proc.is_alive():
            self._proc.join(0)
        self._proc, self._conn = None, None


class WorkerPool:
    """Up to `size` forked workers for one function; calls block until a worker is free."""

    def __init__(self, fn: Callable[..., Any], name: str, size: int | None = None) -> None:
        self.size = size or min(4, os.cpu_count() or 1)
        self._idle: queue.LifoQueue[ForkedWorker] = queue.LifoQueue()
        for i in range(self.size):
            self._idle.put(ForkedWorker(fn, f"{name}-{i}"))
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()

    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None) -> Any:
        worker = self._idle.get()
        try:
            return worker.call(args, kwargs, timeout)
        except WorkerTimeout:
            with self._lock:
                self.stats["timeouts"] += 1
            raise
        except WorkerCrashed:
            with self._lock:
                self.stats["crashes"] += 1
            raise
        finally:
            self._idle.put(worker)

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return
