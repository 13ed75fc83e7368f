"""The loop's capture path as a user meets it: `agentrl up` (one subprocess: nats-server and
every service), an openai-SDK agent with only a base URL and a session header, the end of
its episode, the reward service's first reward, then feedback by episode id and reward
version 2: no agentrl code in the agent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from toolkit import CALL, FINAL, TASK, TOOLS, add, steer

from agentrl.bus.server import free_port


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


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_up_captures_an_unchanged_openai_agent_and_feedback_gives_version_2(
    tmp_path: Path,
) -> None:
    api, gw = free_port(), free_port()
    env = {
        **os.environ,
        "AGENTRL_API_PORT": str(api),
        "AGENTRL_GATEWAY_PORT": str(gw),
        "AGENTRL_DEPLOY_BASE_MODEL": "tiny",
        "AGENTRL_TRAINING_SCHEDULE": "",
    }
    env.pop("NATS_URL", None)
    env.pop("AGENTRL_NATS_URL", None)
    log_path = tmp_path / "up.log"
    log = log_path.open("w+")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "agentrl"), "up", "--data-dir", str(tmp_path / "d")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 200
        ready = False
        while time.monotonic() < deadline and not ready:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError, ValueError):
                ready = (
                    httpx.get(f"http://127.0.0.1:{api}/health", timeout=5).json().get("ok")
                    and httpx.get(f"http://127.0.0.1:{gw}/v1/models", timeout=5).status_code == 200
                )
            time.sleep(0.5)
        assert ready, log_path.read_text()[-3000:]
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
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
