"""The loop's job launcher, forked from the loop's own process before its stack starts.

A training service with `warm_worker` starts a launcher of its own (`python -m
agentrl.training.worker --launcher`): a fresh interpreter that imports torch, transformers
and peft again, ~10 CPU-s, and only once the service starts (after the gateway serves): the
quick loop's first job waited ~25 s for those imports. The loop's process imports the same
modules anyway (its gateway serves the model), so the loop forks the launcher from itself
once they are imported, before any thread of its own or any torch computation runs (a fork
copies no other thread; torch's pools start on first use), and hands the training service
its socket (`AGENTRL_TRAINING_LAUNCHER`). The child is the launcher
`agentrl.training.launcher.serve` runs, with the loop's imports already done: its own
session, stdio into `training/launcher.log`, no handler of the loop's logging; it dies with
the loop (PR_SET_PDEATHSIG) and forks each job exactly as a standalone launcher does.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

from agentrl.training.launcher import exit_forked

log = logging.getLogger(__name__)

LAUNCHER_ENV = "AGENTRL_TRAINING_LAUNCHER"
WARM_ENV = "AGENTRL_TRAINING_WARM_WORKER"


class ForkedLauncher:
    """The forked launcher's process and socket; `stop` ends it (and its jobs)."""

    def __init__(self, pid: int, path: Path) -> None:
        self.pid, self.path = pid, path

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM (the launcher kills its jobs on the way out), SIGKILL after `timeout_s`;
        the socket goes and the environment no longer names it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pid, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(self.pid, 0)
                break
            time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        if os.environ.get(LAUNCHER_ENV) == str(self.path):
            del os.environ[LAUNCHER_ENV]


@contextlib.contextmanager
def stopping(launcher: ForkedLauncher | None) -> Iterator[None]:
    """Stops `launcher` (if any) on the way out."""
    try:
        yield
    finally:
        if launcher is not None:
            launcher.stop()


def wanted() -> bool:
    """A launcher is the loop's to fork: the training service would start one of its own
    (`warm_worker`, the loop's default) and none is given by its socket."""
    warm = os.environ.get(WARM_ENV, "true").strip().lower() in ("1", "true", "yes", "on")
    return warm and not os.environ.get(LAUNCHER_ENV) and hasattr(os, "fork")


def fork_launcher(data_dir: Path) -> ForkedLauncher | None:
    """Import what every job imports, fork the launcher, and name its socket to the training
    service. None (the service then starts its own, as before) when one is given or not
    wanted, when this process already runs other threads, or when the fork fails."""
    if not wanted():
        return None
    from agentrl.training.launcher import PRELOAD, warm_up

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # the job itself reports a broken import
            log.debug("cannot preload %s", name, exc_info=True)
    warm_up()  # what a standalone launcher builds once for its jobs (it starts no thread)
    if threading.active_count() > 1:  # another thread's locks would be held in the child
        return None
    log_path = data_dir / "training" / "launcher.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # a Unix socket's path has at most ~107 bytes: the temporary dir, not the data dir
    path = Path(tempfile.gettempdir()) / f"agentrl-launcher-{uuid.uuid4().hex[:12]}.sock"
    for stream in (sys.stdout, sys.stderr):  # else the child writes their buffers again
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:
        _launcher_child(path, log_path)
    launcher = ForkedLauncher(pid, path)
    deadline = time.monotonic() + 10.0
    while not path.exists():  # it binds the socket first: orders wait in its backlog
        ended, _ = os.waitpid(pid, os.WNOHANG)
        if ended or time.monotonic() > deadline:
            launcher.stop(0.0)
            return None
        time.sleep(0.01)
    os.environ[LAUNCHER_ENV] = str(path)
    log.info("job launcher: pid %d forked from the loop, on %s", pid, path)
    return launcher


def _launcher_child(path: Path, log_path: Path) -> None:
    """The forked child: becomes the launcher and never returns into the loop."""
    code = 1
    try:
        from agentrl.core.deathsig import die_with_parent
        from agentrl.training.launcher import serve
        from agentrl.training.worker import run_job

        os.setsid()  # the terminal's Ctrl-C is the loop's to handle
        die_with_parent()
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, 1)  # never the loop's console (a test's pipe would wait for it)
        os.dup2(out, 2)
        os.close(out)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        _fresh_logging()
        # the loop's event loop (its epoll and self-pipe are the loop's) is no job's: a job
        # that asks for one gets a loop of its own
        asyncio.set_event_loop(None)
        code = serve(path, run_job, preload=())
    except BaseException:
        traceback.print_exc()
    finally:
        exit_forked(code)


def _fresh_logging() -> None:
    """No handler of the loop's (its log file, console, audit file) in the launcher and
    its jobs: a job configures its own `job.log` as a fresh process does."""
    logging.captureWarnings(False)
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger):
            logger.handlers.clear()
    logging.getLogger().setLevel(logging.WARNING)
