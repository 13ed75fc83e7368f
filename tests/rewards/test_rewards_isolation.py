"""A forked worker never outlives its parent: killed by SIGKILL, the service's workers see
the pipe close and exit (before the fix they kept its listening sockets and file locks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

SCRIPT = """
import os, time
from agentrl.rewards.isolation import ForkedWorker
w = ForkedWorker(os.getpid, name="probe")
print(w.call((), {}, timeout=30), flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_worker_exits_when_its_parent_is_sigkilled() -> None:
    parent = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    assert worker != parent.pid and alive(worker)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker)
