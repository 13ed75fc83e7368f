"""A deployment controller + serving manager in a process of its own, so a test can SIGKILL
it between two registry writes (`AGENTRL_DEPLOY_PAUSE_AT`, see `agentrl.release.actions
.fault_point`). It serves the registry's split through the real gateway app (upstream
backends), drives a little traffic through it (sticky sessions) so the gateway's counters
move, follows the reward stream and runs the monitor until it is killed.

    python release_child.py NATS_URL BUCKET PUBLIC DATA_DIR PLAN_JSON
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path


async def main(nats_url: str, bucket: str, public: str, data_dir: str, plan_json: str) -> None:
    import httpx

    from agentrl.bus import Bus
    from agentrl.core.settings import Settings
    from agentrl.release.service import build
    from agentrl.serving.config import DeploySettings, RolloutPlan
    from agentrl.serving.gateway import create_gateway_app

    plan = RolloutPlan.model_validate_json(plan_json)
    bus = await Bus.connect(nats_url)
    deploy = DeploySettings(
        public_model=public,
        bucket=bucket,
        monitor_period_s=plan.analysis.period_s,
        completion_log=False,
        backend="upstream",
    )
    d = await build(bus, Settings(data_dir=Path(data_dir)), deploy, validate=None, plan=plan)
    stop = asyncio.Event()
    app = create_gateway_app(d.state)

    async def traffic() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            i = 0
            while not stop.is_set():
                for _ in range(10):
                    i += 1
                    body = {
                        "model": public,
                        "user": f"s{i % 200}",
                        "max_tokens": 1,
                        "messages": [{"role": "user", "content": "hi"}],
                    }
                    await client.post("/v1/chat/completions", json=body)
                await asyncio.sleep(0.05)

    print("child: up", flush=True)
    await asyncio.gather(
        d.manager.run(stop, poll_s=0.05),
        d.controller.run(stop),
        d.tracker.run(bus, stop),
        traffic(),
    )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
