"""A launcher (`agentrl.training.launcher.serve`) whose jobs are cheap stand-ins: no preload.
A job prints what a test checks into its process.log, sleeps `JOB_DIR/sleep` seconds and
exits with `JOB_DIR/code`. `_launcher_child.py order SOCKET JOB_DIR`: a runner that orders a
job, prints its pid and waits (a test SIGKILLs it)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from agentrl.core.deathsig import die_with_parent
from agentrl.training.launcher import launch, serve


def job(job_dir: Path) -> int:
    die_with_parent()
    print(f"env {os.environ.get('JOB_MARK')} cwd {os.getcwd()} sid {os.getsid(0)}", flush=True)
    print(f"torch imported: {'torch' in sys.modules}", flush=True)
    sleep = job_dir / "sleep"
    time.sleep(float(sleep.read_text()) if sleep.exists() else 0.0)
    code = job_dir / "code"
    return int(code.read_text()) if code.exists() else 0


async def order(path: str, job_dir: str) -> None:
    proc = await launch(path, Path(job_dir), dict(os.environ))
    print(proc.pid, flush=True)
    await proc.wait()


if __name__ == "__main__":
    if sys.argv[1] == "order":
        asyncio.run(order(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(serve(Path(sys.argv[1]), job, preload=()))
