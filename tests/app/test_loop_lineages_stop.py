"""`agentrl loop --lineages 2` cut short, by an error or a signal: the watchers' consumers are
cancelled before the stack's bus closes, so the bus's drain finds nothing busy (left open,
they held it for nats-py's 30 s, later for `Bus.close()`'s bound with a warning) and the
process ends within seconds. Real process and stack, the tiny model; the error is injected
by replacing the run's watch with one that raises once acting is under way."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from stop_kit import free_port_here

from proc_kit import wait_for_line

RAISING = textwrap.dedent(
    """
    import asyncio, sys
    from agentrl.app import loop_lineages

    async def raising_watch(*args, **kw):
        await asyncio.sleep(3)  # the agents acting, the watchers consuming
        print("injected: the watch raises", flush=True)
        raise RuntimeError("injected")

    loop_lineages._watch = raising_watch
    from agentrl.cli import main
    sys.argv = ["agentrl", "loop", *sys.argv[1:]]
    main()
    """
)
BUSY = "still busy at close"  # `Bus.close()`'s warning: a consumer held its drain


def _start(tmp_path: Path, code: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "AGENTRL_API_PORT": str(free_port_here()),
        "AGENTRL_GATEWAY_PORT": str(free_port_here()),
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("NATS_URL", "AGENTRL_NATS_URL"):
        env.pop(name, None)
    args = ["--quick", "--lineages", "2", "--set", "agents=1"]
    args += ["--data-dir", str(tmp_path / "loop")]
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _finish(proc: subprocess.Popen[str], since: float) -> tuple[str, float]:
    rest, _ = proc.communicate(timeout=90)
    return rest, time.monotonic() - since


@contextlib.contextmanager
def _killed_at_the_end(proc: subprocess.Popen[str]) -> Iterator[None]:
    """A failed wait leaves no loop running (its stack dies with it: PDEATHSIG)."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_error_mid_run_stops_the_lineage_loop_with_nothing_left_consuming(
    tmp_path: Path,
) -> None:
    proc = _start(tmp_path, RAISING)
    with _killed_at_the_end(proc):
        seen = wait_for_line(proc, "injected: the watch raises", 600)  # a loaded host: minutes
        rest, took = _finish(proc, time.monotonic())
    out = seen + rest
    assert proc.returncode not in (0, None) and "RuntimeError" in rest, out[-3000:]
    log = (tmp_path / "loop" / "loop.log").read_text()
    assert BUSY not in out and BUSY not in log, "a watcher still consumed when the bus closed"
    assert took < 20, f"stopped {took:.1f} s after the error:\n{out[-3000:]}"


def test_a_signal_stops_the_lineage_loop_within_seconds(tmp_path: Path) -> None:
    proc = _start(tmp_path, RAISING.replace("loop_lineages._watch = raising_watch", ""))
    with _killed_at_the_end(proc):
        seen = wait_for_line(proc, "lake/5x5: agents", 600)  # both lineages live, acting begins
        time.sleep(3.0)
        since = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, took = _finish(proc, since)
    out = seen + rest
    assert proc.returncode == 130, out[-3000:]
    log = (tmp_path / "loop" / "loop.log").read_text()
    assert BUSY not in out and BUSY not in log, "a watcher still consumed when the bus closed"
    assert took < 20, f"stopped {took:.1f} s after the signal:\n{out[-3000:]}"
