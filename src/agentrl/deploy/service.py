"""`serve(bus, stop, settings)`: the deployment controller, its monitor and the gateway in
one process (listed in `agentrl.stack.SERVICES`, so `agentrl up` runs it).

The gateway binds to `settings.gateway_host:gateway_port` (loopback by default). The
controller consumes training statuses (durable consumer `deploy-controller`, so a restart
resumes), validates, rolls out and monitors; the serving manager keeps the gateway's split in
step with the registry; the completion log publishes token records off the request path.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.deploy.actions import Deployer
from agentrl.deploy.config import DeploySettings, RolloutPlan
from agentrl.deploy.controller import BY, Controller
from agentrl.deploy.gateway import CompletionLog, GatewayState, create_gateway_app
from agentrl.deploy.monitor import RewardTracker
from agentrl.deploy.registry import Registry
from agentrl.deploy.serving import ServingManager
from agentrl.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Deployment:
    """Everything `serve` runs, built by `build` (tests and benchmarks use the parts)."""

    registry: Registry
    deployer: Deployer
    state: GatewayState
    manager: ServingManager
    controller: Controller
    tracker: RewardTracker
    completion_log: CompletionLog | None
    settings: DeploySettings


async def build(
    bus: Any,
    settings: Settings,
    deploy: DeploySettings | None = None,
    *,
    engine: Any = None,
    validate: Any = "default",
    plan: RolloutPlan | None = None,
) -> Deployment:
    deploy = deploy or DeploySettings()
    data = Path(settings.data_dir) / "deploy"
    cache = deploy.cache_dir or data / "checkpoints"
    cache.mkdir(parents=True, exist_ok=True)
    registry = await Registry.open(bus.js, deploy.bucket, replicas=settings.stream_replicas)
    endpoint = f"http://{settings.gateway_host}:{settings.gateway_port}/v1/chat/completions"
    deployer = Deployer(registry, bus, deploy.public_model, endpoint)
    completion_log = (
        CompletionLog(bus, max_bytes=int(deploy.completion_log_max_mb * 2**20))
        if deploy.completion_log
        else None
    )
    state = GatewayState(
        deploy.public_model,
        api_keys=deploy.api_keys,
        completion_log=completion_log,
        timeout_s=deploy.backend_timeout_s,
        capture=_capture(bus),
    )
    state.max_inflight = deploy.max_inflight
    tracker = RewardTracker(*deploy.reward_range)
    if validate == "default":
        from agentrl.deploy.validation import Validator

        validate = Validator(deploy, registry, cache)

    async def refused(model_id: str, reason: str) -> None:
        rollout = await registry.get_rollout(deploy.public_model)
        if rollout is not None and rollout.model_id == model_id and rollout.status == "running":
            await deployer.rollback(
                by="agentrl-gateway", reason=f"cannot serve: {reason}", model_id=model_id
            )
        else:
            await registry.record(
                model_id, by="agentrl-gateway", action="refuse_to_serve", reason=reason, evidence={}
            )

    manager = ServingManager(registry, state, deploy, cache, engine=engine, on_refused=refused)
    controller = Controller(
        deployer,
        deploy,
        stats=state.stats,
        tracker=tracker,
        cache_dir=cache,
        validate=validate,
        plan=plan,
    )
    return Deployment(
        registry, deployer, state, manager, controller, tracker, completion_log, deploy
    )


def _capture(bus: Any) -> Any:
    """Episodes at the gateway (`agentrl.capture`) unless AGENTRL_CAPTURE_ENABLED=false."""
    from agentrl.capture.service import CaptureService
    from agentrl.capture.settings import CaptureSettings

    cs = CaptureSettings()
    return CaptureService(bus, cs) if cs.enabled else None


async def run_gateway(app: Any, host: str, port: int, stop: asyncio.Event) -> None:
    """The gateway's HTTP server until `stop`; a port it cannot bind raises (`ListenError`),
    so the service fails visibly and is restarted (it used to keep running without one)."""
    from agentrl.httpserve import serve_http

    await serve_http(app, host, port, stop, "the gateway", lifespan="off", access_log=False)


async def serve(bus: Any, stop: asyncio.Event, settings: Settings) -> None:
    """Run the controller, the monitor and the gateway until `stop` is set. The consumers
    retry with backoff; an inner task that dies for good fails the whole service (the
    stack's supervisor restarts it and `/health` shows the error)."""
    from agentrl.apiauth import check_exposure
    from agentrl.supervision import keep_running, run_tasks

    d = await build(bus, settings)
    check_exposure(
        settings.gateway_host, bool(d.settings.api_keys), "the gateway", settings.allow_open
    )
    await d.deployer.bootstrap(d.settings.base_model, by=BY)
    await d.manager.sync(force=True)
    coros = {
        "deploy-serving": d.manager.run(stop),
        "deploy-monitor": d.controller.run(stop),
        "deploy-rewards": keep_running("reward tracker", lambda: d.tracker.run(bus, stop), stop),
        "deploy-statuses": keep_running(
            "training statuses consumer",
            lambda: bus.consume(
                "agent.rl.training.status.v1",
                "deploy-controller",
                d.controller.handle_status,
                stop=stop,
                batch=8,
                ack_wait=600.0,
            ),
            stop,
        ),
        "gateway": run_gateway(
            create_gateway_app(d.state), settings.gateway_host, settings.gateway_port, stop
        ),
    }
    if d.completion_log is not None:
        coros["completion-log"] = d.completion_log.run(stop)

    async def stop_decoding() -> None:  # open streams end now, so the gateway stops at once
        await stop.wait()
        engine = getattr(d.manager, "engine", None)
        if engine is not None:
            engine.cancel_all()

    coros["stop-decoding"] = stop_decoding()
    if d.state.capture is not None:
        coros["capture"] = d.state.capture.run(stop)
    log.info("gateway on http://%s:%s/v1", settings.gateway_host, settings.gateway_port)
    from agentrl.deploy import gctune

    gctune.settle()  # start-up is done: no full collection walks it again (the tail)
    try:
        await run_tasks(coros, stop)
    finally:
        engine = getattr(d.manager, "engine", None)
        if engine is not None:  # decodes in flight stop now, not at max_tokens
            engine.cancel_all()
        await d.manager.close()
