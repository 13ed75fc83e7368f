"""Issue 54: `agentrl up` stops everything it started on SIGTERM and on SIGINT: its
nats-server, vLLM (the stand-in of tests/app/stop_kit.py) and its job process."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from stop_kit import (
    AGENTRL,
    alive,
    free_port_here,
    fresh_env,
    signal_when,
    standin_vllm,
    stop,
)

from proc_kit import wait_for_line


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
def test_up_stops_vllm_its_job_process_and_everything_else_it_started(
    tmp_path: Path, sig: int
) -> None:
    """`agentrl up` with every service, serving through vLLM (AGENTRL_DEPLOY_BACKEND=vllm):
    it starts vLLM for the base model (the stand-in of stop_kit plays vLLM; the base model is
    a folder, handed to vLLM as it is) and its training service keeps a job launcher (the
    warm worker, torch imported). On either signal nothing `up` started outlives it: the
    server and its engine process, nats-server, the launcher, anything they started. One
    `up` per signal checks both (two tests of one `up` each cost the suite ~16 CPU-s more)."""
    python = standin_vllm(tmp_path)
    (tmp_path / "base").mkdir()
    env = fresh_env(
        tmp_path,
        AGENTRL_VLLM_PYTHON=str(python),
        STANDIN_MARKER=str(tmp_path / "vllm.pids"),
        AGENTRL_DEPLOY_BACKEND="vllm",
        AGENTRL_DEPLOY_BASE_MODEL=str(tmp_path / "base"),
        AGENTRL_TRAINING_WARM_WORKER="true",
        AGENTRL_TRAINING_SCHEDULE="",
        AGENTRL_API_PORT=str(free_port_here()),
        AGENTRL_GATEWAY_PORT=str(free_port_here()),
    )
    env.pop("AGENTRL_TRAINING_LAUNCHER", None)  # its own launcher, not the test session's
    log = tmp_path / "up.log"
    seen: list[str] = []

    def ready(lines: list[str]) -> bool:
        seen[:] = lines
        launcher = [x for x in lines if "agentrl.training.worker" in x]
        return (
            "agentrl is up" in log.read_text()
            and bool(launcher)
            and any("nats-server" in x for x in lines)
            and any("vllm-engine-standin" in x for x in lines)
            and any("standin_vllm.py" in x for x in lines)
        )

    took, left = signal_when([AGENTRL, "up"], env, sig, ready, log, start_s=400)
    assert any("agentrl.training.worker" in x for x in seen), seen  # the job launcher
    assert not left, f"left running after {signal.Signals(sig).name}: {left}"
    assert took < 30, f"exit took {took:.1f} s"
