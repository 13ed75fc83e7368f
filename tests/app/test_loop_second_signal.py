"""`agentrl loop`'s two signals: the first stops acting and still evaluates; a second stops
the stack within seconds, wherever the run is. The tool-use loop once took 31 s after a
second signal during its held-out evaluation (the watchers' subscriptions, never stopped,
held the bus's drain for nats-py's whole 30 s). Real process, real signals, tiny model."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from stop_kit import AGENTRL, free_port_here

from proc_kit import wait_for_line


def test_a_second_signal_stops_the_tooluse_loop_within_seconds(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AGENTRL_API_PORT": str(free_port_here()),
        "AGENTRL_GATEWAY_PORT": str(free_port_here()),
    }
    for name in ("NATS_URL", "AGENTRL_NATS_URL"):
        env.pop(name, None)
    cmd = [AGENTRL, "loop", "--env", "tooluse", "--quick", "--data-dir", str(tmp_path / "loop")]
    cmd += ["--heldout-seeds", "300", "--time-budget-s", "600"]  # a held-out of ~15 s here
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        seen = wait_for_line(proc, "trajectories,", 180)  # acting, the signals caught
        proc.send_signal(signal.SIGINT)
        seen += wait_for_line(proc, "interrupted: acting stops", 60)
        time.sleep(1.0)  # the evaluation under way: the rewards' tail, then the held-out
        second = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=90)
        took = time.monotonic() - second
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = seen + rest
    assert "interrupted again: stopping now" in rest, out[-3000:]
    assert "held-out: agentrl-policy-base" not in out  # the second came during the evaluation
    assert proc.returncode == 130, out[-3000:]
    assert took < 10, f"stopped {took:.1f} s after the second signal:\n{out[-3000:]}"
