"""Running `agentrl loop` as a user does: its own process, free ports, no NATS from outside."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentrl.bus.server import free_port


def run_loop_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AGENTRL_API_PORT": str(free_port()),
        "AGENTRL_GATEWAY_PORT": str(free_port()),
    }
    for name in ("NATS_URL", "AGENTRL_NATS_URL"):
        env.pop(name, None)
    return subprocess.run(
        [str(Path(sys.executable).parent / "agentrl"), "loop", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
