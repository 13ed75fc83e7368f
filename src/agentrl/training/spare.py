"""One job process started ahead of its job (`AGENTRL_TRAINING_WARM_WORKER=true`).

A job process spends its first seconds importing torch and transformers (5-8 s on two busy
cores) before it reads a byte of data. A spare does those imports while the runner waits,
then blocks on its stdin; the next job hands it its folder and environment, and from then on
it is that job's process exactly as a freshly started one would be: its own session, its
`process.log`, SIGTERM to cancel, death with the runner. One spare at a time, started again
after each hand-over; a spare that died meanwhile is replaced by a fresh start, never
waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("agentrl.training.spare")

SPARE_FLAG = "--spare"


class SpareWorker:
    """The runner's side: start a spare, hand it a job, stop it."""

    def __init__(
        self, log_path: Path, env: dict[str, str], preexec_fn: Callable[[], None] | None
    ) -> None:
        self.log_path = log_path
        self.env = env
        self.preexec_fn = preexec_fn
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start a spare unless one is waiting (a failure to start is logged: jobs then
        start their own processes)."""
        if self.proc is not None and self.proc.returncode is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.log_path, "wb") as fh:
                self.proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "agentrl.training.worker",
                    SPARE_FLAG,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=fh,
                    stderr=fh,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=self.preexec_fn,
                )
        except OSError as exc:
            log.warning("cannot start a spare job process: %s", exc)
            self.proc = None

    async def take(self, job_dir: Path, env: dict[str, str]) -> asyncio.subprocess.Process | None:
        """The spare, now running the job in `job_dir` with `env`; None when there is no live
        spare (the caller starts a process of its own)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None or proc.stdin is None:
            if proc is not None and proc.returncode is not None:
                log.warning(
                    "the spare job process had exited (%s, see %s): starting a fresh one",
                    proc.returncode,
                    self.log_path,
                )
            return None
        order = json.dumps({"job_dir": str(job_dir), "env": env}).encode() + b"\n"
        try:
            proc.stdin.write(order)
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            await _end(proc)
            return None
        return proc

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            await _end(proc)


async def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), 5)


# ---- the spare's side (in agentrl.training.worker) -------------------------------------------

PRELOAD = (
    "torch",
    "transformers",
    "peft",
    "agentrl.llm.loading",
    "agentrl.llm.checkpoint",
    "agentrl.llm.trainer",
    "agentrl.training.jobs",
    "agentrl.training.samples",
    "agentrl.training.choice_job",
)


def wait_for_job() -> Path | None:
    """In the spare: import what every job imports, then wait for the runner's order; take
    the job's environment and send stdout and stderr to its `process.log`. None: the runner
    closed the pipe without a job (it stopped)."""
    import importlib
    import os

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the job itself reports a broken import
            print(f"spare: cannot preload {name}: {exc}", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return None
    order = json.loads(line)
    os.environ.clear()
    os.environ.update(order["env"])
    job_dir = Path(order["job_dir"])
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(job_dir / "process.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return job_dir
