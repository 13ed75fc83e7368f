"""A gateway worker process (`python -m agentrl.release.gateway_worker`): the gateway and its
serving manager only, on the deploy service's port (SO_REUSEPORT), started by the deploy
service when `AGENTRL_DEPLOY_GATEWAY_WORKERS` > 1 (`agentrl.serving.gateway_workers` says
what the processes share and how). No controller, no reward tracker: the process that runs
them reads this worker's counters from the subject it publishes them on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

from agentrl.bus.client import Bus
from agentrl.core.settings import get_settings
from agentrl.release.service import gateway_state
from agentrl.release.serving_manager import ServingManager
from agentrl.serving import gateway_workers as gw
from agentrl.serving.config import DeploySettings
from agentrl.serving.gateway import create_gateway_app
from agentrl.serving.registry import Registry

log = logging.getLogger(__name__)

READY_WAIT_S = 300.0  # listen without a routable split after this long (503s, as the first)


async def serve_worker(stop: asyncio.Event) -> None:
    """Serve the gateway on the shared port until `stop`."""
    from agentrl.core.httpserve import serve_http
    from agentrl.core.supervision import run_tasks
    from agentrl.serving import gctune

    settings, deploy = get_settings(), DeploySettings()
    index = os.environ.get(gw.WORKER_ENV, "1")
    subject = os.environ[gw.STATS_ENV]
    bus = await Bus.connect(settings=settings, name=f"agentrl-gateway-{index}")
    registry = await Registry.open(bus.js, deploy.bucket, replicas=settings.stream_replicas)
    state = gateway_state(bus, deploy)  # no capture: workers refuse it
    cache = deploy.cache_dir or Path(settings.data_dir) / "deploy" / "checkpoints"
    manager = ServingManager(registry, state, deploy, cache)  # refusals: the main process's
    sock = gw.reuse_port_socket(settings.gateway_host, settings.gateway_port)
    worker = f"{index}-{os.getpid()}"
    try:
        # listen once the split can be served (the deploy service may still be bootstrapping)
        deadline = asyncio.get_running_loop().time() + READY_WAIT_S
        while not stop.is_set():
            try:
                await manager.sync(force=True)
            except Exception:  # the registry not ready yet: tried again
                log.warning("gateway worker %s: registry not readable yet", index, exc_info=True)
            if state.weights or asyncio.get_running_loop().time() > deadline:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
        coros = {
            "serving": manager.run(stop),
            "stats": gw.publish_stats(bus, subject, worker, state, stop),
            "gateway": serve_http(
                create_gateway_app(state),
                settings.gateway_host,
                settings.gateway_port,
                stop,
                f"gateway worker {index}",
                sock=sock,
                lifespan="off",
                access_log=False,
            ),
        }
        if state.completion_log is not None:
            coros["completion-log"] = state.completion_log.run(stop)
        gctune.settle()
        log.info("gateway worker %s serving on %s:%s", index, *sock.getsockname()[:2])
        await run_tasks(coros, stop)
    finally:
        sock.close()
        await manager.close()
        await bus.close()


async def _main() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await serve_worker(stop)


def main() -> None:
    from agentrl.core.gcstart import raise_young_generation
    from agentrl.serving import gctune

    raise_young_generation()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    gctune.run(_main())


if __name__ == "__main__":
    main()
