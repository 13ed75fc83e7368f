"""Issue 33.9: Ctrl-C stops `agentrl up` within seconds even while the gateway is decoding
long streams for clients (uvicorn waited for open streams without limit and decode threads
ran to max_tokens, so `agentrl up` ignored Ctrl-C until killed). A real subprocess, real
streaming clients, SIGINT."""

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

from agentrl.bus.server import free_port

STOP_WITHIN_S = 20.0
SERVICES_STOP_WITHIN_S = 5.0


def _stream_forever(url: str, stop: threading.Event) -> None:
    body = {
        "model": "agentrl-policy",
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 1900,
        "stream": True,
    }
    while not stop.is_set():
        try:
            with httpx.stream("POST", url, json=body, timeout=120) as resp:
                for _ in resp.iter_bytes():
                    if stop.is_set():
                        return
        except httpx.HTTPError:
            time.sleep(0.2)


def test_sigint_stops_up_in_seconds_while_streams_decode(tmp_path: Path) -> None:
    api, gw = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "AGENTRL_NATS_URL")} | {
        "AGENTRL_API_PORT": str(api),
        "AGENTRL_GATEWAY_PORT": str(gw),
        "AGENTRL_DEPLOY_BASE_MODEL": "tiny",
        "AGENTRL_TRAINING_SCHEDULE": "",
    }
    log = (tmp_path / "up.log").open("w+")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "agentrl"), "up", "--data-dir", str(tmp_path / "d")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    stop = threading.Event()
    clients: list[threading.Thread] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{gw}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        url = f"http://127.0.0.1:{gw}/v1/chat/completions"
        for _ in range(6):
            t = threading.Thread(target=_stream_forever, args=(url, stop), daemon=True)
            t.start()
            clients.append(t)
        time.sleep(3)  # the streams are decoding now
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
