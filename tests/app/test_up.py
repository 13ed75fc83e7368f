"""`agentrl up` as a newcomer runs it: one subprocess starts nats-server and every service,
prints the URLs, `/health` shows each service running, the gateway answers `/v1/models`, and
SIGINT stops everything with no process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from agentrl.app.stack import SERVICES
from agentrl.bus.server import free_port


def test_up_starts_every_service_and_sigint_stops_all(tmp_path: Path) -> None:
    api, gw = free_port(), free_port()
    env = {
        **os.environ,
        "AGENTRL_API_PORT": str(api),
        "AGENTRL_GATEWAY_PORT": str(gw),
        "AGENTRL_DEPLOY_BASE_MODEL": "tiny",
        "AGENTRL_TRAINING_SCHEDULE": "",
        "NATS_URL": "",
        "AGENTRL_NATS_URL": "",
    }
    env.pop("NATS_URL")
    env.pop("AGENTRL_NATS_URL")
    log = (tmp_path / "up.log").open("w+")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "agentrl"), "up", "--data-dir", str(tmp_path / "data")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    children: list[psutil.Process] = []
    body: dict = {}
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            try:
                body = httpx.get(f"http://127.0.0.1:{api}/health", timeout=5).json()
                models = httpx.get(f"http://127.0.0.1:{gw}/v1/models", timeout=5)
                if body.get("ok") and models.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert body.get("ok"), body
        assert set(body["services"]) == {label for label, _ in SERVICES}
        assert all(s["state"] == "running" for s in body["services"].values())
        ids = [m["id"] for m in models.json()["data"]]
        assert "agentrl-policy" in ids
        metrics = httpx.get(f"http://127.0.0.1:{api}/metrics", timeout=5)
        assert metrics.status_code == 200
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("nats-server" in c.name() for c in children)
        out = (tmp_path / "up.log").read_text()
        assert f"http://127.0.0.1:{gw}/v1" in out and f"http://127.0.0.1:{api}/metrics" in out
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert rc == 0, (tmp_path / "up.log").read_text()[-3000:]
    assert "stopped cleanly" in (tmp_path / "up.log").read_text()
    time.sleep(0.5)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"orphans after SIGINT: {[(c.pid, c.name()) for c in alive]}"


def test_up_help_says_how_to_point_an_openai_client_and_agent_zero() -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "agentrl"), "up", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "120"},
    ).stdout
    for needle in ("base_url=", "/v1", "agentrl-policy", "agent-zero install", "--data-dir"):
        assert needle in out, needle
