"""The rl_training tool (the installed plugin's Tool class, called as Agent Zero calls it) and
the feedback helper against a real `agentrl up` stack: control API + training service."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from a0_kit import Checkout, recording, stream_payloads
from a0_standins import LoopData, classes_in, install_standins, make_checkout, remove_standins

from agentrl.bus.server import free_port
from agentrl.core.settings import Settings
from agentrl.integrations.agent_zero import hooks, state
from agentrl.integrations.agent_zero.feedback import (
    feedback_event,
    last_trajectory_id,
    send_feedback,
)

pytest.importorskip(
    "agentrl.training.api", reason="agentrl.training.api (the training control API) is missing"
)

TOKEN = "a0-test-token"


async def call_tool(co: Checkout, agent: Any, method: str, args: dict[str, Any]) -> str:
    """Load tools/rl_training.py from the installed plugin and run it like Agent Zero's
    get_tool + process_tools do."""
    from helpers.tool import Tool

    (cls,) = classes_in(co.plugin_dir / "tools" / "rl_training.py", Tool)
    tool = cls(
        agent=agent,
        name="rl_training",
        method=method,
        args=args,
        message="",
        loop_data=LoopData(),
    )
    response = await tool.execute(**args)
    assert response.break_loop is False
    return str(response.message)


async def test_training_tool_and_feedback_against_agentrl_up(
    tmp_path: Path, a0_nats: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrl.app.stack import stack_services

    monkeypatch.setenv("AGENTRL_TRAINING_THRESHOLD", "0")
    monkeypatch.setenv("AGENTRL_TRAINING_SCHEDULE", "")
    port = free_port()
    settings = Settings(
        data_dir=tmp_path / "agentrl",
        nats_url=a0_nats.url,
        api_port=port,
        api_tokens={TOKEN: ["training:read", "training:write", "feedback:write"]},
    )
    root = make_checkout(tmp_path / "agent-zero")
    install_standins(root)
    try:
        co = Checkout(root, a0_nats.url, api_url=f"http://127.0.0.1:{port}", api_token=TOKEN)
        rec = recording("main_with_tools")
        agent, _ = await co.run(rec)
        async with stack_services(a0_nats.url, settings, only={"control API", "training service"}):
            await _wait_api(port)
            text = await call_tool(
                co,
                agent,
                "start",
                {"algorithm": "grpo", "base_model": "tiny", "min_reward": 0.5, "notes": "a0 test"},
            )
            m = re.search(r"training job ([0-9a-f-]{36}) submitted", text)
            assert m, text
            job_id = m.group(1)
            status = await _poll_status(co, agent, job_id)
            assert re.search(rf"training job {job_id}: (queued|running|failed|completed)", status)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                r = await http.post(
                    f"/training/{job_id}/cancel", headers={"Authorization": f"Bearer {TOKEN}"}
                )
                assert r.status_code in (200, 202, 409), r.text
            unknown = await call_tool(co, agent, "status", {"job_id": "no-such-job"})
            assert "refused the request (404)" in unknown
            assert "needs a job_id" in await call_tool(co, agent, "status", {})

            # feedback on the chat's last trajectory, through the same spool
            tid = last_trajectory_id(agent.context)
            assert tid is not None
            event = feedback_event(
                tid, "rating", rating=4, comment="good", session_id=agent.context.id
            )
            assert await send_feedback(hooks.config_for(co.plugin_dir / "plugin.yaml"), event)
            stored = await stream_payloads(a0_nats.url, "agent.rl.feedback.v1")
            mine = [f for f in stored if f["feedback_id"] == event.feedback_id]
            assert len(mine) == 1 and mine[0]["trajectory_id"] == tid and mine[0]["rating"] == 4

        # the API gone: the tool says so instead of raising into Agent Zero
        down = await call_tool(co, agent, "start", {"algorithm": "grpo"})
        assert "unreachable" in down
    finally:
        remove_standins(root)
        state.reset_caches()


async def _wait_api(port: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    async with httpx.AsyncClient() as http:
        while True:
            try:
                await http.get(f"http://127.0.0.1:{port}/health")
                return
            except httpx.HTTPError:
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.2)


async def _poll_status(co: Checkout, agent: Any, job_id: str, timeout: float = 30.0) -> str:
    end = time.monotonic() + timeout
    while True:
        text = await call_tool(co, agent, "status", {"job_id": job_id})
        if "refused the request (404)" not in text or time.monotonic() > end:
            return text
        await asyncio.sleep(0.3)
