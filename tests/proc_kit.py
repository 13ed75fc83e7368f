"""Reading a started command's output (the whole-stack and bus tests): one `wait_for_line`."""

from __future__ import annotations

import subprocess
import time


def wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float = 90) -> str:
    """What `proc` printed up to and including the first line with `needle` (its stdout a
    text pipe); AssertionError with the output so far when it exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    seen = ""
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen += line
        if needle in line:
            return seen
    raise AssertionError(f"{needle!r} not printed; output so far:\n{seen}")
