"""Issue 54: `agentrl up` stops everything it started on SIGTERM and on SIGINT: its
nats-server, vLLM (the stand-in of tests/app/stop_kit.py) and its job process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from stop_kit import (
    AGENTRL,
    alive,
    free_port_here,
    fresh_env,
    left_running,
    signal_when,
    standin_vllm,
    stop,
    wait_for_line,
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_up_stops_its_nats_server(tmp_path: Path, sig: int) -> None:
    env = {**os.environ, "AGENTRL_DATA_DIR": str(tmp_path), "COLUMNS": "200"}
    env.pop("NATS_URL", None)
    env.pop("AGENTRL_NATS_URL", None)
    proc = subprocess.Popen(
        [AGENTRL, "up", "--no-services"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    wait_for_line(proc, "agentrl is up")
    servers = [c for c in psutil.Process(proc.pid).children(recursive=True) if "nats" in c.name()]
    assert servers
    took = stop(proc, sig)
    assert not [c.pid for c in servers if alive(c.pid)]
    assert took < 10, f"exit took {took:.1f} s"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_up_with_vllm_stops_its_vllm(tmp_path: Path, sig: int) -> None:
    """`agentrl up` serving through vLLM (AGENTRL_DEPLOY_BACKEND=vllm) starts vLLM for the
    base model: on either signal the server and its engine process are gone with it (the
    stand-in above plays vLLM; the base model is a folder, handed to vLLM as it is)."""
    python = standin_vllm(tmp_path)
    (tmp_path / "base").mkdir()
    env = fresh_env(
        tmp_path,
        AGENTRL_VLLM_PYTHON=str(python),
        STANDIN_MARKER=str(tmp_path / "vllm.pids"),
        AGENTRL_DEPLOY_BACKEND="vllm",
        AGENTRL_DEPLOY_BASE_MODEL=str(tmp_path / "base"),
        AGENTRL_API_PORT=str(free_port_here()),
        AGENTRL_GATEWAY_PORT=str(free_port_here()),
    )

    def ready(lines: list[str]) -> bool:
        return any("vllm-engine-standin" in x for x in lines) and any(
            "standin_vllm.py" in x for x in lines
        )

    took, left = signal_when([AGENTRL, "up"], env, sig, ready, tmp_path / "up.log")
    assert not left, f"left running after {signal.Signals(sig).name}: {left}"
    assert took < 30, f"exit took {took:.1f} s"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_up_stops_its_job_process_and_everything_else_it_started(tmp_path: Path, sig: int) -> None:
    """`agentrl up` with every service: its training service keeps a job launcher (the warm
    worker, torch imported); on either signal nothing `up` started outlives it (nats-server,
    the launcher, anything they started)."""
    port = free_port_here()
    env = {
        **os.environ,
        "AGENTRL_DATA_DIR": str(tmp_path / "data"),
        "AGENTRL_TRAINING_WARM_WORKER": "true",
        "AGENTRL_TRAINING_SCHEDULE": "",
        "AGENTRL_API_PORT": str(port),
        "AGENTRL_GATEWAY_PORT": str(free_port_here()),
        "COLUMNS": "200",
    }
    for k in ("NATS_URL", "AGENTRL_NATS_URL", "AGENTRL_TRAINING_LAUNCHER"):
        env.pop(k, None)  # its own launcher, not the test session's
    log = tmp_path / "up.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [AGENTRL, "up"], stdout=fh, stderr=subprocess.STDOUT, text=True, env=env
        )
    kids: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            kids = psutil.Process(proc.pid).children(recursive=True)
            jobs = [k for k in kids if "nats" not in k.name()]
            if "agentrl is up" in log.read_text() and jobs:
                break
            time.sleep(0.5)
        assert jobs, f"no job launcher started ahead:\n{log.read_text()[-3000:]}"
        assert any("nats" in k.name() for k in kids)
        took = stop(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = left_running(kids, grace=0.5)
    assert not left, f"left running after {signal.Signals(sig).name}: {left}"
    assert took < 30, f"exit took {took:.1f} s"
