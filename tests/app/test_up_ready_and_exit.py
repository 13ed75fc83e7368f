"""Issue 50.8 / 54: `agentrl up` is "up" only when it serves, and it exits when stopped.

- A service with a readiness probe stays "starting" (and `/health` not ok) until its HTTP
  server answers; `up` says what it waits for.
- After Ctrl-C, a forward pass still running in the stack's worker pool (a held-out
  evaluation) no longer keeps the process alive: it printed "stopped cleanly" and lived
  ~30 s longer, because asyncio.run and the interpreter join every pool thread.
Real processes, a real nats-server, real HTTP.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import uvicorn

from agentrl.app.stack import Probe, ServiceHealth, answers_http, supervise
from agentrl.bus.server import free_port
from agentrl.core.settings import Settings
from proc_kit import wait_for_line


async def _ok(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


async def test_a_probed_service_is_starting_until_its_server_answers() -> None:
    port = free_port()
    stop, serving = asyncio.Event(), asyncio.Event()

    async def slow_gateway(bus: object, stop: asyncio.Event, settings: object) -> None:
        await serving.wait()  # "loading the model"
        server = uvicorn.Server(
            uvicorn.Config(_ok, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
        )
        task = asyncio.create_task(server.serve())
        await stop.wait()
        server.should_exit = True
        await task

    health = ServiceHealth("deployment controller")
    probe = Probe("the gateway", "127.0.0.1", port)
    task = asyncio.create_task(
        supervise("gw", slow_gateway, None, stop, Settings(), health, probe=probe)  # type: ignore[arg-type]
    )
    await asyncio.sleep(1.0)
    assert health.state == "starting" and not health.healthy
    assert health.waiting_for == "the gateway"
    assert not await answers_http("127.0.0.1", port)
    serving.set()
    for _ in range(200):
        if health.healthy:
            break
        await asyncio.sleep(0.05)
    assert health.state == "running" and health.waiting_for is None
    assert await answers_http("127.0.0.1", port)
    assert health.ready_after_s is not None and health.ready_after_s >= 0.9
    stop.set()
    await asyncio.wait_for(task, 10)
    assert health.state == "stopped"


SLOW_STACK = """
import asyncio, sys, time
from agentrl.app import stack

async def serve(bus, stop, settings):
    # a held-out evaluation: a forward pass in the stack's pool that nobody awaits at stop
    asyncio.get_running_loop().run_in_executor(None, time.sleep, 60)
    await stop.wait()

sys.modules["slow_eval"] = sys.modules[__name__]
stack.SERVICES = (("evaluator", "slow_eval:serve"),)
stack.run_stack(data_dir=sys.argv[1])
"""


def test_sigint_exits_promptly_with_a_forward_pass_still_running(tmp_path: Path) -> None:
    script = tmp_path / "slow_stack.py"
    script.write_text(textwrap.dedent(SLOW_STACK))
    env = {**os.environ, "COLUMNS": "200", "AGENTRL_DATA_DIR": str(tmp_path / "data")}
    env.pop("NATS_URL", None)
    env.pop("AGENTRL_NATS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "data")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    seen = ""
    try:
        seen = wait_for_line(proc, "agentrl is up")
        time.sleep(0.5)  # the pool thread is sleeping now
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=45)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopped cleanly" in rest, seen + rest
    assert proc.returncode == 0, seen + rest
    assert took < 10, f"exited {took:.1f} s after SIGINT:\n{rest}"
    assert "without waiting for 1 worker thread" in rest


SLOW_GATEWAY = """
import asyncio, sys
import uvicorn
from agentrl.app import stack

async def ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})

async def serve(bus, stop, settings):
    await asyncio.sleep(4)  # converting the model
    server = uvicorn.Server(uvicorn.Config(ok, host="127.0.0.1", port=settings.gateway_port,
                                           log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    await stop.wait()
    server.should_exit = True
    await task

sys.modules["slow_gateway"] = sys.modules[__name__]
stack.SERVICES = (("deployment controller", "slow_gateway:serve"),)
stack.run_stack(data_dir=sys.argv[1])
"""


def test_up_says_what_it_waits_for_and_is_up_only_when_the_gateway_serves(
    tmp_path: Path,
) -> None:
    """`agentrl is up` came 7 min 40 s before the gateway accepted a connection."""
    script = tmp_path / "slow_gateway.py"
    script.write_text(textwrap.dedent(SLOW_GATEWAY))
    port = free_port()
    env = {**os.environ, "COLUMNS": "200", "AGENTRL_GATEWAY_PORT": str(port)}
    env.pop("NATS_URL", None)
    env.pop("AGENTRL_NATS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "data")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    seen = ""
    try:
        seen = wait_for_line(proc, "agentrl is up")
        assert asyncio.run(answers_http("127.0.0.1", port)), "up before the gateway serves"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    waiting = f"waiting for the gateway on http://127.0.0.1:{port}/v1 (deployment controller)"
    assert waiting in seen and seen.index(waiting) < seen.index("agentrl is up"), seen
    took = float(seen.split("serving after ")[1].split(" s")[0])
    assert took >= 3.5, seen
