"""`agentrl up` as a user meets it, one `up` for all of it (each `up` with the tiny model costs
~12 CPU-s to ready; tests/app/test_up.py started one of its own for its SIGINT checks):

- one subprocess starts nats-server and every service, prints the URLs, `/health` shows each
  service running and the gateway answers `/v1/models`;
- the loop's capture path: an openai-SDK agent with only a base URL and a session header, the
  end of its episode, the reward service's first reward, then feedback by episode id and
  reward version 2: no agentrl code in the agent;
- SIGINT stops everything with no process left behind, within seconds even while the gateway
  decodes long streams for clients (issue 33.9: uvicorn waited for open streams without limit
  and decode threads ran to max_tokens, so `agentrl up` ignored Ctrl-C until killed)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from openai import OpenAI
from toolkit import CALL, FINAL, TASK, TOOLS, add, steer

from agentrl.app.stack import SERVICES
from agentrl.bus.server import free_port

STOP_WITHIN_S = 20.0
SERVICES_STOP_WITHIN_S = 5.0
STREAMS = 6


def rewards_of(nats_url: str, trajectory_id: str) -> list[dict[str, Any]]:
    from agentrl.bus import Bus

    async def read() -> list[dict[str, Any]]:
        bus = await Bus.connect(nats_url, name="capture-stack-test")
        try:
            info = await bus.js.stream_info("RL_REWARDS")
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    doc = json.loads((await bus.js.get_msg("RL_REWARDS", seq)).data)
                except Exception:
                    continue
                if doc.get("trajectory_id") == trajectory_id:
                    out.append(doc)
            return out
        finally:
            await bus.close()

    return asyncio.run(read())


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


def _capture_an_agent(api: int, gw: int, log_path: Path) -> None:
    """The capture path: the agent's episode, its reward (version 1), feedback (version 2)."""
    found = re.search(r"nats://127\.0\.0\.1:\d+", log_path.read_text())
    assert found, log_path.read_text()[-3000:]
    nats_url = found.group(0)

    # the agent: a base URL and a session header, nothing else
    session = f"up-{os.getpid()}-{time.time_ns()}"
    client = OpenAI(
        base_url=f"http://127.0.0.1:{gw}/v1",
        api_key="unused",
        default_headers={"x-agentrl-session": session},
        max_retries=2,
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    for choice in (CALL, FINAL):
        r = client.chat.completions.create(
            model="agentrl-policy",
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            extra_body=steer(choice),
        )
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for c in msg.tool_calls or []:
            out = add(**json.loads(c.function.arguments))  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
    ended = httpx.post(
        f"http://127.0.0.1:{gw}/v1/episodes/{session}/end", json={"success": True}, timeout=30
    )
    assert ended.status_code == 200, ended.text
    tid = ended.json()["trajectory_id"]
    assert ended.json()["turns"] == 2

    def wait_versions(n: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            got = rewards_of(nats_url, tid)
            if len(got) >= n:
                return sorted(got, key=lambda d: d["metadata"]["version"])
            time.sleep(0.5)
        raise AssertionError(f"no reward version {n} for {tid}: {log_path.read_text()[-2000:]}")

    v1 = wait_versions(1)
    assert v1[0]["metadata"]["version"] == 1
    fb = httpx.post(
        f"http://127.0.0.1:{api}/feedback",
        json={"episode_id": session, "metric_name": "solved", "value": True},
        timeout=30,
    )
    assert fb.status_code == 202, fb.text
    got = wait_versions(2)
    assert [d["metadata"]["version"] for d in got] == [1, 2]
    assert got[1]["reward_components"]["user_feedback"]["score"] == 1.0


@pytest.mark.timeout(400)  # not `slow` (the capture part was): the SIGINT checks never were
def test_up_serves_captures_an_unchanged_agent_and_sigint_stops_all_while_streams_decode(
    tmp_path: Path,
) -> None:
    api, gw = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "AGENTRL_NATS_URL")} | {
        "AGENTRL_API_PORT": str(api),
        "AGENTRL_GATEWAY_PORT": str(gw),
        "AGENTRL_DEPLOY_BASE_MODEL": "tiny",
        "AGENTRL_TRAINING_SCHEDULE": "",
    }
    log_path = tmp_path / "up.log"
    log = log_path.open("w+")
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
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                body = httpx.get(f"http://127.0.0.1:{api}/health", timeout=5).json()
                models = httpx.get(f"http://127.0.0.1:{gw}/v1/models", timeout=5)
                if body.get("ok") and models.status_code == 200:
                    break
            except (httpx.HTTPError, ValueError):
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
        out = log_path.read_text()
        assert f"http://127.0.0.1:{gw}/v1" in out and f"http://127.0.0.1:{api}/metrics" in out

        _capture_an_agent(api, gw, log_path)

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
            proc.wait(10)
    out = log_path.read_text()
    assert rc == 0, out[-3000:]
    assert took < STOP_WITHIN_S, f"SIGINT took {took:.1f} s\n{out[-2000:]}"
    assert "stopped cleanly" in out
    # the grammar pools' idle threads end with the process (they held every exit for 2 s)
    assert "agentrl-grammar" not in out, out[-2000:]
    # every service (the gateway with its open streams included) stopped within seconds; the
    # rest of `took` is the interpreter's exit (chdb closes its store at exit)
    line = next(x for x in out.splitlines() if "deployment controller stopped" in x)
    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert stamp - sent < SERVICES_STOP_WITHIN_S, f"services stopped {stamp - sent:.1f} s after"
    time.sleep(0.5)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"orphans after SIGINT: {[(c.pid, c.name()) for c in alive]}"
