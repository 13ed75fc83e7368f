"""`agentrl up --replicas 2`: two of every service on one machine, as a real process tree.
Both gateways and both control APIs answer on their own ports, one deployment controller
holds the lease, each training runner keeps its own records (shared checkpoints), and
Ctrl-C stops the replica processes too."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentrl.bus.server import free_port


def _two_free_ports() -> int:
    """A port p with p and p + 1 free."""
    for _ in range(50):
        p = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
        except OSError:
            continue
        return p
    raise AssertionError("no two adjacent free ports")


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


async def _controller_holders(nats_url: str) -> list[str]:
    from agentrl.bus import Bus
    from agentrl.bus.kv import kv_keys
    from agentrl.bus.lease import holder, lease_bucket
    from agentrl.release.service import lease_ttl_s

    bus = await Bus.connect(nats_url)
    try:
        kv = await lease_bucket(bus.js, lease_ttl_s())
        keys = [k for k in await kv_keys(kv) if k.endswith(".controller")]
        return [h for k in keys if (h := await holder(kv, k))]
    finally:
        await bus.close()


@pytest.mark.slow
def test_up_replicas_runs_two_of_every_service(tmp_path: Path) -> None:
    api, gw = _two_free_ports(), _two_free_ports()
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "AGENTRL_NATS_URL")} | {
        "AGENTRL_API_PORT": str(api),
        "AGENTRL_GATEWAY_PORT": str(gw),
        # an OpenAI-compatible server as the backend (none listens there: no request is
        # sent): what runs twice is every service, not the engine, and neither process
        # imports torch (the embedded engine in each cost ~7 CPU-s; tests/capture/test_stack_capture.py
        # serves the tiny model through `up`)
        "AGENTRL_DEPLOY_BACKEND": "upstream",
        "AGENTRL_DEPLOY_UPSTREAM_URL": f"http://127.0.0.1:{free_port()}/v1",
        "AGENTRL_DEPLOY_BASE_MODEL": "tiny",
        "AGENTRL_TRAINING_SCHEDULE": "",
    }
    data = tmp_path / "d"
    log = (tmp_path / "up.log").open("w+")
    agentrl = str(Path(sys.executable).parent / "agentrl")
    proc = subprocess.Popen(
        [agentrl, "up", "--data-dir", str(data), "--replicas", "2"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        urls = [f"http://127.0.0.1:{p}/v1/models" for p in (gw, gw + 1)]
        urls += [f"http://127.0.0.1:{p}/health" for p in (api, api + 1)]
        deadline = time.monotonic() + 240
        while not all(_up(u) for u in urls):
            assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()[-3000:]
            time.sleep(1.0)
        out = (tmp_path / "up.log").read_text()
        nats_url = next(
            line.split("export NATS_URL=")[1].split()[0]
            for line in out.splitlines()
            if "export NATS_URL=" in line
        )
        holders = asyncio.run(_controller_holders(nats_url))
        assert len(holders) == 1, holders  # one active controller, one standby
        # each training runner keeps its own records; a runner opens them as it starts,
        # which on a loaded host can come after both gateways and APIs answer
        states = [data / "training" / "replicas" / "replica-1", data / "training"]
        while not all((s / "state.sqlite").exists() for s in states):
            assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()[-3000:]
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, (tmp_path / "up.log").read_text()[-3000:]
        assert not _up(urls[1]), "replica 1 still serves after Ctrl-C"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
