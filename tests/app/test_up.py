"""`agentrl up` as a newcomer runs it: one subprocess starts nats-server and every service,
prints the URLs, `/health` shows each service running, the gateway answers `/v1/models`, and
SIGINT stops everything with no process left behind, within seconds even while the gateway
decodes long streams for clients (issue 33.9: uvicorn waited for open streams without limit
and decode threads ran to max_tokens, so `agentrl up` ignored Ctrl-C until killed). One `up`
for both (they were two tests of one `up` each: ~10 CPU-s of the suite more)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import psutil

from agentrl.app.stack import SERVICES
from agentrl.bus.server import free_port

STOP_WITHIN_S = 20.0
SERVICES_STOP_WITHIN_S = 5.0
STREAMS = 6


def _stream_forever(url: str, stop: threading.Event, decoding: threading.Semaphore) -> None:
    """A client reading a long stream; `decoding` released once, at its first bytes."""
    body = {
        "model": "agentrl-policy",
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 1900,
        "stream": True,
    }
    told = False
    while not stop.is_set():
        try:
            with httpx.stream("POST", url, json=body, timeout=120) as resp:
                for _ in resp.iter_bytes():
                    if not told:
                        told = True
                        decoding.release()
                    if stop.is_set():
                        return
        except httpx.HTTPError:
            time.sleep(0.2)


def test_up_starts_every_service_and_sigint_stops_all_while_streams_decode(
    tmp_path: Path,
) -> None:
    api, gw = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "AGENTRL_NATS_URL")} | {
        "AGENTRL_API_PORT": str(api),
        "AGENTRL_GATEWAY_PORT": str(gw),
        "AGENTRL_DEPLOY_BASE_MODEL": "tiny",
        "AGENTRL_TRAINING_SCHEDULE": "",
    }
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
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 180
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
        # long streams for clients, every one decoding when Ctrl-C comes
        url = f"http://127.0.0.1:{gw}/v1/chat/completions"
        decoding = threading.Semaphore(0)
        for _ in range(STREAMS):
            args = (url, stop, decoding)
            threading.Thread(target=_stream_forever, args=args, daemon=True).start()
        for k in range(STREAMS):
            assert decoding.acquire(timeout=120), f"{k} of {STREAMS} streams decoding"
        started = time.monotonic()
        sent = time.time()
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("agentrl up ignored SIGINT for 60 s") from None
        took = time.monotonic() - started
    finally:
        stop.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = (tmp_path / "up.log").read_text()
    assert rc == 0, out[-3000:]
    assert took < STOP_WITHIN_S, f"SIGINT took {took:.1f} s\n{out[-2000:]}"
    assert "stopped cleanly" in out
    # every service (the gateway with its open streams included) stopped within seconds; the
    # rest of `took` is the interpreter's exit (chdb closes its store at exit)
    line = next(x for x in out.splitlines() if "deployment controller stopped" in x)
    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert stamp - sent < SERVICES_STOP_WITHIN_S, f"services stopped {stamp - sent:.1f} s after"
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
