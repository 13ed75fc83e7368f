"""`serve(bus, stop, settings)`: the deployment controller, its monitor and the gateway in
one process (listed in `agentrl.app.stack.SERVICES`, so `agentrl up` runs it).

The gateway binds to `settings.gateway_host:gateway_port` (loopback by default). The
controller consumes training statuses (durable consumer `deploy-controller`, so a restart
resumes), validates, rolls out and monitors; the serving manager keeps the gateway's split in
step with the registry; the completion log publishes token records off the request path.

Any number of these processes may run (one per host, or beside each other): every one serves
the gateway, and one at a time is the controller, elected through a KV lease
(`agentrl.bus.lease`, `AGENTRL_DEPLOY_LEASE_TTL_S`, 6 s by default). The others stand by and
take over within one TTL of the active one's death, from the registry alone (a half-done
promote or rollback is finished from its intent record, the monitor's evidence re-read from
the reward stream).

Every process also answers hold requests (`agentrl.release.holds`, one of them per request):
a version no split routes, served by its id for a while (the loop's held-out evaluation).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.bus.client import TRANSIENT
from agentrl.bus.lease import Lease, lease_bucket, while_leader
from agentrl.core.settings import Settings
from agentrl.release.actions import Deployer
from agentrl.release.controller import BY, Controller
from agentrl.release.holds import HoldServer
from agentrl.release.monitor import RewardTracker
from agentrl.release.serving_manager import ServingManager
from agentrl.serving import gateway_workers
from agentrl.serving.config import DeploySettings, RolloutPlan
from agentrl.serving.gateway import CompletionLog, GatewayState, create_gateway_app
from agentrl.serving.registry import Registry

log = logging.getLogger(__name__)

LEASE_TTL_S = 6.0


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
    fleet: Any = None  # agentrl.release.fleet.Fleet: one Deployer + Controller per lineage


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
    state = gateway_state(bus, deploy, capture=_capture(bus))
    tracker = RewardTracker(*deploy.reward_range)
    if validate == "default":
        from agentrl.release.validation import Validator

        validate = Validator(deploy, registry, cache)

    async def refused(model_id: str, reason: str) -> None:
        record = await registry.get_model(model_id)
        public = record.public_name if record is not None else deploy.public_model
        rollout = await registry.get_rollout(public)
        if rollout is not None and rollout.model_id == model_id and rollout.status == "running":
            owner = (
                deployer
                if public == deploy.public_model
                else Deployer(registry, bus, public, endpoint)
            )
            await owner.rollback(
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
        # every gateway process's counters (worker processes publish theirs)
        stats=gateway_workers.FleetStats(state.stats),
        tracker=tracker,
        cache_dir=cache,
        validate=validate,
        plan=plan,
    )
    from agentrl.release.fleet import Fleet

    d = Deployment(
        registry, deployer, state, manager, controller, tracker, state.completion_log, deploy
    )
    d.fleet = Fleet(d, bus, endpoint, validate, plan, cache)
    return d


def gateway_state(bus: Any, deploy: DeploySettings, capture: Any = None) -> GatewayState:
    """The gateway's state as `deploy` configures it (keys, completion log, timeout, in-flight
    cap): the deploy service's and each gateway worker process's."""
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
        capture=capture,
    )
    state.max_inflight = deploy.max_inflight
    return state


def _capture(bus: Any) -> Any:
    """Episodes at the gateway (`agentrl.capture`) unless AGENTRL_CAPTURE_ENABLED=false."""
    from agentrl.capture.service import CaptureService
    from agentrl.capture.settings import CaptureSettings

    cs = CaptureSettings()
    return CaptureService(bus, cs) if cs.enabled else None


def lease_ttl_s() -> float:
    return float(os.environ.get("AGENTRL_DEPLOY_LEASE_TTL_S") or LEASE_TTL_S)


def controller_owner() -> str:
    """This process's name in the controller lease: unique per process (two processes must
    never both think they hold it), named after `AGENTRL_REPLICA_ID` or the host."""
    base = os.environ.get("AGENTRL_REPLICA_ID") or socket.gethostname()
    return f"{base}-{os.getpid()}-{secrets.token_hex(3)}"


async def run_elected(
    d: Deployment,
    bus: Any,
    stop: asyncio.Event,
    *,
    replicas: int = 1,
    owner: str | None = None,
    ttl_s: float | None = None,
    statuses: bool = True,
) -> None:
    """The controller's work (the monitor and the training statuses consumer) only while this
    process holds the controller lease of its public name; standing by otherwise. The
    controller checks the lease before every look, so a holder cut off from NATS stops
    acting before its lease can pass to another process."""
    from agentrl.core.supervision import keep_running, run_tasks

    ttl = ttl_s or lease_ttl_s()
    kv = await lease_bucket(bus.js, ttl, replicas)
    key = "deploy." + re.sub(r"[^A-Za-z0-9_-]", "_", d.settings.public_model) + ".controller"
    lease = Lease(kv, key, owner or controller_owner(), ttl)
    d.controller.lease = lease
    d.fleet.lease = lease

    async def lead(leader_stop: asyncio.Event) -> None:
        log.info("deployment controller active (%s)", lease.owner)
        coros = {"deploy-monitor": d.fleet.run(leader_stop)}
        if statuses:
            coros["deploy-statuses"] = keep_running(
                "training statuses consumer",
                lambda: bus.consume(
                    "agent.rl.training.status.v1",
                    "deploy-controller",
                    d.fleet.handle_status,
                    stop=leader_stop,
                    batch=8,
                    ack_wait=600.0,
                ),
                leader_stop,
            )
        await run_tasks(coros, leader_stop)

    await while_leader(lease, lead, stop)


async def run_gateway(
    app: Any, host: str, port: int, stop: asyncio.Event, sock: Any = None
) -> None:
    """The gateway's HTTP server until `stop`; a port it cannot bind raises (`ListenError`),
    so the service fails visibly and is restarted (it used to keep running without one).
    `sock`: bound already, shared with the gateway's worker processes (SO_REUSEPORT)."""
    from agentrl.core.httpserve import serve_http

    await serve_http(
        app, host, port, stop, "the gateway", sock=sock, lifespan="off", access_log=False
    )


def _workers(
    d: Deployment, bus: Any, settings: Settings, stop: asyncio.Event
) -> tuple[Any, Any, dict[str, Any]]:
    """With `gateway_workers` > 1: the shared socket, the worker processes (started now) and
    the tasks that keep them running and fold their counters into the controller's
    evidence; else (None, None, {})."""
    from agentrl.core.httpserve import ListenError

    count = d.settings.gateway_workers
    gateway_workers.check(count, d.settings.backend, d.state.capture is not None)
    if count <= 1:
        return None, None, {}
    fleet = d.controller.stats
    assert isinstance(fleet, gateway_workers.FleetStats)  # (what `build` gives it)
    host, port = settings.gateway_host, settings.gateway_port
    try:
        sock = gateway_workers.reuse_port_socket(host, port)
    except OSError as exc:
        raise ListenError(f"the gateway could not listen on {host}:{port}: {exc}") from exc
    subject = gateway_workers.new_subject()
    env = gateway_workers.worker_env(settings, gateway_workers.bus_url(bus, settings), subject)
    pool = gateway_workers.WorkerPool(count, env, Path(settings.data_dir).resolve() / "logs")
    pool.start_all()
    d.state.workers, d.state.fleet = pool, fleet
    return (
        sock,
        pool,
        {
            "gateway-stats": gateway_workers.collect_stats(bus, subject, fleet, stop),
            "gateway-workers": pool.run(stop),
        },
    )


def _front(d: Deployment, bus: Any, settings: Settings) -> Any:
    """`gateway_front = "rust"`: the compiled front on the gateway's port, its routes and
    counters kept by `agentrl.serving.front.FrontRunner`."""
    from agentrl.serving import front

    front.check(d.settings, d.state.capture is not None)
    data = Path(settings.data_dir).resolve()
    return front.FrontRunner(
        d.state,
        d.controller.stats,
        data / "deploy" / "front-routes.json",
        f"{settings.gateway_host}:{settings.gateway_port}",
        gateway_workers.bus_url(bus, settings) if d.completion_log is not None else None,
        log=data / "logs" / "gateway-front.log",
    )


async def _at_start_up(
    call: Callable[[], Awaitable[Any]], stop: asyncio.Event, patience_s: float = 180.0
) -> None:
    """A registry call at start-up, retried while NATS is away or a cluster still elects
    the bucket's leader (a replica started beside a forming cluster used to die here on
    `nats: timeout`, and nothing outside `agentrl up` restarted it). A call still running
    when `stop` is set is let go (the first sync loads the model: a cold GGUF conversion
    held `agentrl up` past SIGINT for the stack's whole stop grace)."""
    from agentrl.core.supervision import until_stopped

    deadline = asyncio.get_running_loop().time() + patience_s
    for attempt in itertools.count():
        try:
            await until_stopped(call(), stop)
            return
        except TRANSIENT as exc:
            if stop.is_set() or asyncio.get_running_loop().time() > deadline:
                raise
            wait = min(0.5 * 2**attempt, 5.0)
            log.warning("registry not ready (%s); retrying in %.1f s", type(exc).__name__, wait)
            await asyncio.sleep(wait)


async def serve(bus: Any, stop: asyncio.Event, settings: Settings) -> None:
    """Run the controller, the monitor and the gateway until `stop` is set. The consumers
    retry with backoff; an inner task that dies for good fails the whole service (the
    stack's supervisor restarts it and `/health` shows the error)."""
    from agentrl.core.apiauth import check_exposure
    from agentrl.core.supervision import keep_running, run_tasks

    d = await build(bus, settings)
    check_exposure(
        settings.gateway_host, bool(d.settings.api_keys), "the gateway", settings.allow_open
    )
    # the gateway's worker processes (if any) start now: their start-up overlaps this one's
    sock, pool, workers = _workers(d, bus, settings, stop)
    try:
        await _at_start_up(lambda: d.deployer.bootstrap(d.settings.base_model, by=BY), stop)
        await _at_start_up(lambda: d.manager.sync(force=True), stop)
        holds = HoldServer(d.registry, d.settings.public_model)
        coros = {
            "deploy-serving": d.manager.run(stop),
            "deploy-controller": run_elected(d, bus, stop, replicas=settings.stream_replicas),
            "deploy-rewards": keep_running(
                "reward tracker", lambda: d.tracker.run(bus, stop), stop
            ),
            "gateway": run_gateway(
                create_gateway_app(d.state),
                settings.gateway_host,
                settings.gateway_port,
                stop,
                sock,
            )
            if d.settings.gateway_front == "python"
            else _front(d, bus, settings).run(stop),
            # versions no split routes, served by id for a while (`agentrl loop`'s held-out)
            "deploy-holds": keep_running("hold requests", lambda: holds.run(bus, stop), stop),
            **workers,
        }
        if d.completion_log is not None:
            coros["completion-log"] = d.completion_log.run(stop)

        async def stop_decoding() -> None:  # open streams end now: the gateway stops at once
            await stop.wait()
            engine = getattr(d.manager, "engine", None)
            if engine is not None:
                engine.cancel_all()

        coros["stop-decoding"] = stop_decoding()
        if d.state.capture is not None:
            coros["capture"] = d.state.capture.run(stop)
        log.info(
            "gateway on http://%s:%s/v1 (%d process(es))",
            settings.gateway_host,
            settings.gateway_port,
            max(1, d.settings.gateway_workers),
        )
        from agentrl.serving import gctune

        gctune.settle()  # start-up is done: no full collection walks it again (the tail)
        await run_tasks(coros, stop)
    finally:
        if pool is not None:  # (stopped by its task already, unless start-up failed)
            await asyncio.to_thread(pool.stop)
        if sock is not None:
            sock.close()
        engine = getattr(d.manager, "engine", None)
        if engine is not None:  # decodes in flight stop now, not at max_tokens
            engine.cancel_all()
        await d.manager.close()
