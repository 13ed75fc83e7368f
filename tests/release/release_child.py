"""A deployment-service replica in a process of its own, so a test can SIGKILL it between two
registry writes (`AGENTRL_DEPLOY_PAUSE_AT`, see `agentrl.release.actions.fault_point`): the
serving manager, the real gateway app (upstream backends) with a little sticky-session traffic
so its counters move, the reward tracker, and the controller, until it is killed. Given an
OWNER and a TTL the controller runs under the election (`agentrl.release.service.run_elected`),
as every replica of `agentrl up --replicas` does.

    python release_child.py NATS_URL BUCKET PUBLIC DATA_DIR PLAN_JSON [OWNER TTL_S]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any


async def main(
    nats_url: str,
    bucket: str,
    public: str,
    data_dir: str,
    plan_json: str,
    owner: str | None = None,
    ttl: str | None = None,
) -> None:
    import logging

    import httpx

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("httpx", "agentrl.audit"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from agentrl.bus import Bus
    from agentrl.core.settings import Settings
    from agentrl.release.service import build, run_elected
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

    controller: Any = (
        d.controller.run(stop)
        if owner is None
        else run_elected(d, bus, stop, owner=owner, ttl_s=float(ttl or 2.0), statuses=False)
    )
    print(f"child {owner or ''}: up", flush=True)
    await asyncio.gather(
        d.manager.run(stop, poll_s=0.05), controller, d.tracker.run(bus, stop), traffic()
    )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:8]))
