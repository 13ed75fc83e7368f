"""`agentrl soak`: the whole loop under failures, and what survived it.

Agents act on FrozenLake through the gateway with the official `openai` SDK (tiny model,
`guided_choice`) and publish every episode as `agent.rl.trajectory.v1`, continuously. While
they do, the soak kills, once each and one after the other, and lets come back:

* the control API, whose port another program holds when the stack starts (it fails and is
  restarted with backoff like any service, the rest keeps running, it serves once freed),
* the reward service (SIGKILL of its process, restarted like a supervisor would),
* the warehouse ingester (SIGKILL, restarted),
* a running training job's process (SIGKILL of the worker child; the training service must
  survive and mark the job failed, and the next trigger's job must run),
* the training service itself while a job runs (the worker must die with it; the restarted
  service resumes the job from its checkpoint or fails it, never leaves it 'running'),
* nats-server (SIGKILL, restarted on the same port and store dir; every client reconnects),
* nats-server stopped for a minute (longer than the publish retry window) while a training
  job ends: afterwards the job's final status is on RL_TRAINING and the next request starts,
* the deployment controller + gateway (the agents' errors meanwhile are counted; the restarted
  gateway serves the same versions from the registry),
* the deployment controller again, stopped between two registry writes of a rollback and then
  of a promotion (`AGENTRL_DEPLOY_PAUSE_AT`) and SIGKILLed there: the restarted one finishes
  each, the rolled-back version never comes back, no rollout stays half-done, and the
  registry's split is what the gateway reports serving.

Real processes: nats-server, the reward service (`agentrl rewards serve`), the warehouse
ingester (`agentrl warehouse serve`), the training service (`agentrl train serve`) with its
job processes, and the deployment controller + gateway (`agentrl deploy serve`) each run as
their own OS process, so a kill is a real SIGKILL. The control API and the agents run in the
soak's own process (they are clients like any other and must reconnect too).

Afterwards it checks: every published trajectory is in the stream once and has exactly one
reward per reward version (read back from RL_REWARDS); the warehouse (chdb, read once the
ingester has stopped) holds as many trajectories and rewards as the streams; no training job
is left queued or running (control API); the gateway's client errors are all counted (none
silent). The last line is one JSON object; the exit code is 1 when a check failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import httpx2  # the openai SDK's own httpx (its http_client must be one of these)

from agentrl.bench.soak_config import SoakConfig
from agentrl.training.dataset import reward_version

MOVES = ["up", "down", "left", "right"]
LOG_FILE = "soak.log"  # `agentrl soak`'s log, written before the soak starts: not "data"
ACTIVE = ("queued", "running")


def soak_environment(cfg: SoakConfig) -> dict[str, str]:
    """Settings of the services for a demo-sized loop (the environment of every process)."""
    return {
        "AGENTRL_TRAINING_THRESHOLD": str(cfg.threshold),
        "AGENTRL_TRAINING_SCHEDULE": "",
        "AGENTRL_TRAINING_BASE_MODEL": cfg.model,
        "AGENTRL_TRAINING_ALGORITHM": "grpo",
        "AGENTRL_TRAINING_ADVANTAGE_ESTIMATOR": "gigpo",
        "AGENTRL_TRAINING_SAMPLE_SIZE": "64",
        "AGENTRL_TRAINING_BATCH_SIZE": "8",
        "AGENTRL_TRAINING_EPOCHS": "1",
        "AGENTRL_TRAINING_MAX_LENGTH": "256",
        "AGENTRL_TRAINING_HOLDOUT_SIZE": "0.0",
        "AGENTRL_TRAINING_STATUS_EVERY_STEPS": "1",
        "AGENTRL_TRAINING_SAVE_INTERVAL": "1",  # a killed service's job resumes from a step
        "AGENTRL_DEPLOY_BASE_MODEL": cfg.model,
        "AGENTRL_DEPLOY_RAMP": "[50.0, 100.0]",
        "AGENTRL_DEPLOY_STEP_DELAY_S": "1.0",
        "AGENTRL_DEPLOY_MONITOR_PERIOD_S": "0.5",
        "AGENTRL_DEPLOY_MIN_SAMPLES": "4",
        "AGENTRL_DEPLOY_INCONCLUSIVE_DEADLINE_S": "60",  # an undecided canary ends, not hangs
        "AGENTRL_DEPLOY_BENCHMARK_EPISODES": "1",
        "AGENTRL_DEPLOY_VALIDATION_MAX_NEW_TOKENS": "12",
        "AGENTRL_DEPLOY_SAFETY_MAX_DROP": "1.0",  # a random tiny model's safety is noise
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE", "1"),
        "TOKENIZERS_PARALLELISM": "false",
    }


# ---- service processes --------------------------------------------------------------------


class ServiceProc:
    """One service as its own OS process (own session, log in the data dir)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.signalled: set[int] = set()  # pids sent SIGTERM

    def start(self) -> None:
        from agentrl.core.deathsig import terminate_with_parent

        with open(self.log, "ab") as fh:
            fh.write(f"\n---- soak: start #{self.starts + 1} ----\n".encode())
            fh.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
                preexec_fn=terminate_with_parent,  # a killed soak leaves no service behind
            )
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> list[Any]:
        """SIGKILL the service's process only, as a crash would; returns its children (they
        are on their own: they must notice and exit)."""
        import psutil

        assert self.proc is not None
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return children

    def terminate(self) -> None:
        """SIGTERM, without waiting: `stop` then waits. The soak's way out signals every
        service first: stopped one after the other, the last one went on starting (torch
        imported, ~4 CPU-s) while the first ones stopped."""
        proc = self.proc
        if proc is not None and proc.poll() is None and proc.pid not in self.signalled:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            self.signalled.add(proc.pid)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a clean stop; once: a second one would interrupt its clean-up), then
        SIGKILL the whole process group after `timeout`."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left
        return proc.returncode


# ---- the agents -----------------------------------------------------------------------------


@dataclass
class ClientCounts:
    """Every HTTP request the agents made to the gateway: answered or a counted error."""

    requests: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    last_error_at: float = 0.0
    last_ok_at: float = 0.0


class CountingTransport(httpx2.AsyncBaseTransport):
    """Counts each request's outcome below the SDK, so no failure can go unseen."""

    def __init__(self, counts: ClientCounts) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.counts = counts

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        c = self.counts
        c.requests += 1
        try:
            response = await self.inner.handle_async_request(request)
        except Exception as exc:
            c.errors[type(exc).__name__] += 1
            c.last_error_at = time.monotonic()
            raise
        if response.status_code >= 400:
            c.errors[f"HTTP {response.status_code}"] += 1
            c.last_error_at = time.monotonic()
        else:
            c.ok += 1
            c.last_ok_at = time.monotonic()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class SoakAgents:
    """Groups of FrozenLake episodes through the gateway; each episode is published (retried
    under the same id while NATS is away, so an outage delays a trajectory, never loses it)."""

    def __init__(self, cfg: SoakConfig, bus: Any, gateway_url: str, public: str) -> None:
        from openai import AsyncOpenAI

        self.cfg, self.bus, self.public, self.gateway_url = cfg, bus, public, gateway_url
        self.counts = ClientCounts()
        self.http = httpx2.AsyncClient(transport=CountingTransport(self.counts), timeout=60.0)
        self.client = AsyncOpenAI(
            base_url=gateway_url, api_key="agentrl-soak", max_retries=0, http_client=self.http
        )
        self.published: dict[str, float] = {}
        self.feedback: set[str] = set()  # trajectories that got feedback: reward version 2
        self.burst = 0  # of `published`, the copies published in bursts
        self.recent: deque[Any] = deque(maxlen=64)
        self.critical_episodes = 0
        self.publish_retries = 0
        self.publish_failed = 0
        self.group_errors: Counter[str] = Counter()
        self.next_seed = 0

    async def group(self, seed: int) -> None:
        from agentrl.envs.registry import task_for
        from agentrl.rollout.convert import episode_to_trajectory
        from agentrl.rollout.policies.openai_policy import OpenAIAgentPolicy
        from agentrl.rollout.worker import RLRolloutWorker

        task = task_for(
            "frozenlake-4x4", seed, max_episode_steps=self.cfg.max_steps, obs_format="egocentric"
        )
        policy = OpenAIAgentPolicy(
            self.public,
            client=self.client,
            temperature=1.0,
            max_tokens=4,
            guided_choice=MOVES,
            max_retries=3,
            backoff_base=0.2,
        )
        group_id = str(uuid.uuid4())
        workers = [
            RLRolloutWorker(task, policy, history_window=0, group_id=group_id, episode_index=i)
            for i in range(self.cfg.group_size)
        ]
        for ep in await asyncio.gather(*(w.run() for w in workers)):
            if ep.critical_error:
                self.critical_episodes += 1
            if not ep.steps:
                continue
            event = episode_to_trajectory(
                ep, agent_id="agentrl-soak", model=served_by(ep), temperature=1.0
            )
            for turn, step in zip(event.turns, ep.steps, strict=False):
                action: Any = turn.action  # an open object: the gateway contract's extras
                cid = (step.policy_logprobs or {}).get("completion_id")
                if cid:
                    action.completion_id = str(cid)
                action.guided_choice = list(MOVES)
            await self.publish(event)
            self.recent.append(event)

    async def publish(self, event: Any) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                await self.bus.publish(event)
                self.published[event.trajectory_id] = time.monotonic()
                return
            except Exception:
                if time.monotonic() > deadline:
                    self.publish_failed += 1
                    raise
                self.publish_retries += 1
                await asyncio.sleep(1.0)

    async def run(self, stop: asyncio.Event) -> None:
        async def worker() -> None:
            while not stop.is_set():
                seed, self.next_seed = self.next_seed, self.next_seed + 1
                try:
                    await self.group(seed)
                except Exception as exc:  # counted; the agent keeps acting
                    self.group_errors[type(exc).__name__] += 1
                    await asyncio.sleep(0.5)

        await asyncio.gather(*(worker() for _ in range(self.cfg.agents)))

    async def close(self) -> None:
        await self.client.close()
        await self.http.aclose()


def served_by(episode: Any) -> str | None:
    for step in episode.steps:
        model = (step.policy_logprobs or {}).get("model")
        if model:
            return str(model)
    return None


class Burst:
    """Copies of the agents' trajectories (new ids) published in pipelined chunks, and
    thumbs-up feedback on every `feedback_every`-th (reward version 2, or folded into version 1
    when the service sees it first), so a kill lands mid-batch."""

    def __init__(self, bus: Any, agents: SoakAgents, feedback_every: int = 4) -> None:
        self.bus, self.agents, self.feedback_every = bus, agents, feedback_every
        self.sent = 0
        self.retries = 0
        self.failed = 0

    async def _publish(self, events: list[Any]) -> None:
        deadline = time.monotonic() + 120
        while True:
            try:
                await self.bus.publish_many(events)
                return
            except Exception:  # NATS away: the same ids again (JetStream drops duplicates)
                if time.monotonic() > deadline:
                    self.failed += len(events)
                    raise
                self.retries += 1
                await asyncio.sleep(0.5)

    async def run(self, n: int, chunk: int = 25, pause: float = 0.0) -> None:
        from agentrl.contracts.base import utcnow
        from agentrl.contracts.feedback import FeedbackEvent

        # copies of the agents' own recent episodes under new ids: the training jobs' dataset
        # stays FrozenLake with guided_choice (a valid-action dataset)
        recent = list(self.agents.recent)
        if not recent:
            raise RuntimeError("no agent trajectory to copy for a burst yet")
        events = [
            recent[i % len(recent)].model_copy(
                update={"trajectory_id": str(uuid.uuid4()), "agent_id": "agentrl-soak-burst"}
            )
            for i in range(n)
        ]
        for k in range(0, n, chunk):
            part = events[k : k + chunk]
            await self._publish(part)
            now = time.monotonic()
            for e in part:
                self.agents.published[e.trajectory_id] = now
            self.sent += len(part)
            self.agents.burst += len(part)
            if pause:
                await asyncio.sleep(pause)
        liked = [e.trajectory_id for e in events[:: self.feedback_every]]
        await self._publish(
            [FeedbackEvent(trajectory_id=t, timestamp=utcnow(), type="thumbs_up") for t in liked]
        )
        self.agents.feedback.update(liked)


# ---- probes ---------------------------------------------------------------------------------


async def last_seq(bus: Any, stream: str) -> int | None:
    try:
        info = await asyncio.wait_for(bus.js.stream_info(stream), 2.0)
        return int(info.state.last_seq)
    except Exception:
        return None


async def ack_floor(bus: Any, stream: str, durable: str) -> int | None:
    try:
        info = await asyncio.wait_for(bus.js.consumer_info(stream, durable), 2.0)
        return int(info.ack_floor.stream_seq) if info.ack_floor else 0
    except Exception:
        return None


async def delivered(bus: Any, stream: str, durable: str) -> int | None:
    """How many messages the consumer has handed out (grows only while a client pulls)."""
    try:
        info = await asyncio.wait_for(bus.js.consumer_info(stream, durable), 2.0)
        return int(info.delivered.consumer_seq) if info.delivered else 0
    except Exception:
        return None


async def threshold_durable(bus: Any) -> str:
    """The training service's threshold consumer: one per runner since runners can be
    replicas (`training-threshold-<runner>`), so it is found by its prefix."""
    try:
        infos = await asyncio.wait_for(bus.js.consumers_info("RL_REWARDS"), 5.0)
    except Exception:
        infos = []
    names = sorted(i.name for i in infos if str(i.name).startswith("training-threshold"))
    return names[0] if names else "training-threshold"


async def delivered_seq(bus: Any, stream: str, durable: str) -> int | None:
    """The last stream sequence the consumer handed out."""
    try:
        info = await asyncio.wait_for(bus.js.consumer_info(stream, durable), 2.0)
        return int(info.delivered.stream_seq) if info.delivered else 0
    except Exception:
        return None


async def consumer_idle(bus: Any, stream: str, durable: str) -> bool:
    try:
        info = await asyncio.wait_for(bus.js.consumer_info(stream, durable), 2.0)
    except Exception:
        return False
    return not info.num_pending and not info.num_ack_pending


async def wait_for(check: Callable[[], Any], timeout: float, period: float = 0.25) -> float | None:
    """Seconds until `await check()` is true, or None after `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(Exception):
            if await check():
                return time.monotonic() - t0
        await asyncio.sleep(period)
    return None


def grows(get: Callable[[], Any], above: int | None) -> Callable[[], Any]:
    async def check() -> bool:
        now = await get()
        return now is not None and now > (above or 0)

    return check


# ---- the soak -------------------------------------------------------------------------------


@dataclass
class SoakResult:
    recovery_s: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(self.checks.values())

    def summary(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "recovery_s": {
                k: round(v, 1) if v is not None else None for k, v in self.recovery_s.items()
            },
            **self.figures,
            "failed_checks": sorted(k for k, v in self.checks.items() if not v),
            "wall_s": round(self.wall_s, 1),
        }


async def run_soak(cfg: SoakConfig, say: Callable[[str], None] = print) -> SoakResult:
    import logging

    from agentrl.app.stack import stack_services
    from agentrl.bus.client import Bus
    from agentrl.bus.server import EmbeddedNats, free_port
    from agentrl.core.settings import Settings

    for noisy in ("httpx", "httpx2"):  # one INFO line per agent request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    me = asyncio.current_task()
    if me is not None:  # SIGTERM / Ctrl-C: stop the services and nats-server on the way out
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                asyncio.get_running_loop().add_signal_handler(sig, me.cancel)
    t_start = time.monotonic()
    data_dir = Path(cfg.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if any(p.name != LOG_FILE for p in data_dir.iterdir()):
        raise ValueError(f"{data_dir} is not empty: give the soak a fresh folder")
    logs = data_dir / "logs"
    logs.mkdir()
    api_port, gw_port = free_port(), free_port()
    settings = Settings(data_dir=data_dir, api_port=api_port, gateway_port=gw_port, nats_url=None)
    server = EmbeddedNats(settings=settings)
    server.start()
    url = server.url
    env = {
        **os.environ,
        **soak_environment(cfg),
        "AGENTRL_DATA_DIR": str(data_dir),
        "AGENTRL_API_PORT": str(api_port),
        "AGENTRL_GATEWAY_PORT": str(gw_port),
        "NATS_URL": url,
        "AGENTRL_NATS_URL": url,
    }
    os.environ.update(soak_environment(cfg))  # this process reads deploy settings too
    exe = str(Path(sys.executable).parent / "agentrl")
    procs = {
        "rewards": ServiceProc(
            "reward service",
            [exe, "rewards", "serve", "--nats-url", url],
            env,
            logs / "rewards.log",
        ),
        "warehouse": ServiceProc(
            "warehouse ingester",
            [exe, "warehouse", "serve", "--nats-url", url],
            env,
            logs / "warehouse.log",
        ),
        "training": ServiceProc(
            "training service", [exe, "train", "serve", "--nats", url], env, logs / "training.log"
        ),
        "deploy": ServiceProc(
            "deployment controller + gateway",
            [exe, "deploy", "serve", "--nats-url", url],
            env,
            logs / "deploy.log",
        ),
    }
    result = SoakResult()
    gateway = f"http://127.0.0.1:{gw_port}/v1"
    api = f"http://127.0.0.1:{api_port}"
    squatter = _take_port(api_port) if cfg.api_port_taken else None
    try:
        async with stack_services(url, settings, only={"control API"}) as stack:
            for p in procs.values():
                p.start()
            say(f"soak: nats {url}, gateway {gateway}, control API {api}, data {data_dir}")
            bus = await Bus.connect(url, settings=settings, name="agentrl-soak")
            async with httpx.AsyncClient(timeout=5.0) as http:
                up = await wait_for(lambda: _http_ok(http, f"{gateway}/models"), 240, 0.5)
                if up is None:
                    raise TimeoutError("the gateway did not answer within 240 s")
                say(f"soak: stack up in {time.monotonic() - t_start:.1f}s")
                if squatter is not None:
                    await _api_port_taken(squatter, stack, procs, http, api, gateway, result, say)
                    squatter = None
                from agentrl.serving.config import DeploySettings

                agents = SoakAgents(cfg, bus, gateway, DeploySettings().public_model)
                stop_acting = asyncio.Event()
                acting = asyncio.create_task(agents.run(stop_acting))
                try:
                    await _faults(cfg, bus, server, procs, http, api, agents, result, say)
                    await asyncio.sleep(cfg.settle_s)
                finally:
                    stop_acting.set()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(acting, 90)
                say(f"soak: acting stopped; {len(agents.published)} trajectories published")
                await _drain(cfg, bus, http, api, agents, result, say)
                await _check_streams(bus, agents, result, say)
                jobs = await _settled_jobs(cfg, http, api)
                await agents.close()
            for key in ("rewards", "training", "deploy", "warehouse"):
                rc = procs[key].stop()
                say(f"soak: {procs[key].name} stopped (exit {rc})")
            await bus.close()
        _check_jobs(jobs, result, say)
        _check_warehouse(settings, result, say)
        _check_gateway(agents, result, say)
    finally:
        if squatter is not None:
            squatter.close()
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.stop(5.0)
        server.stop()
    result.wall_s = time.monotonic() - t_start
    return result


def _take_port(port: int) -> Any:
    """A listening socket on `port` (another program holding the control API's port)."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(1)
    return sock


async def _api_port_taken(
    squatter: Any,
    stack: Any,
    procs: dict[str, ServiceProc],
    http: httpx.AsyncClient,
    api: str,
    gateway: str,
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    """Phase 0: the control API's port was taken when the stack started. The API is an
    ordinary failing service (restarted with backoff, its error shown); everything else
    kept running; once the port is free the API serves within its backoff."""
    health = stack.health["control API"]
    failed = await wait_for(lambda: _true(health.restarts >= 1), 30, 0.2)
    say(
        f"soak: control API port taken at start: {health.restarts} restart(s), "
        f"state {health.state}, error: {health.last_error}"
    )
    result.checks["port taken: the control API failed as a service (restarts, error shown)"] = (
        failed is not None and "could not listen" in (health.last_error or "")
    )
    alive = all(p.proc is not None and p.proc.poll() is None for p in procs.values())
    models = await http.get(f"{gateway}/models")
    result.checks["port taken: the rest of the stack kept running"] = (
        alive and models.status_code == 200
    )
    squatter.close()
    back = await wait_for(lambda: _http_ok(http, f"{api}/health"), 60, 0.2)
    result.recovery_s["control API after its port was freed"] = back
    result.checks["port taken: the control API serves once the port is free"] = back is not None
    say(f"soak:   control API serving {_fmt(back)} after the port was freed")


async def _true(value: bool) -> bool:
    return value


async def _http_ok(http: httpx.AsyncClient, url: str) -> bool:
    return (await http.get(url)).status_code == 200


async def _faults(
    cfg: SoakConfig,
    bus: Any,
    server: Any,
    procs: dict[str, ServiceProc],
    http: httpx.AsyncClient,
    api: str,
    agents: SoakAgents,
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    rec = result.recovery_s
    t = cfg.recover_timeout_s
    warm = await wait_for(lambda: grows(lambda: last_seq(bus, "RL_REWARDS"), 8)(), 300, 0.5)
    if warm is None:
        raise TimeoutError("no rewards flowing 300 s after the agents started")
    say(f"soak: rewards flowing ({len(agents.published)} trajectories published)")

    # 1. the reward service: back = a new reward; in-flight = what the killed process had
    # fetched but not acked is redelivered (after the consumer's ack_wait) and done
    await _kill_consumer_service(
        "reward service",
        "reward_service",
        procs["rewards"],
        grows_from=lambda: last_seq(bus, "RL_REWARDS"),
        consumer=(bus, "RL_TRAJECTORIES", "rewards"),
        agents=agents,
        cfg=cfg,
        result=result,
        say=say,
    )
    # 2. the warehouse ingester: back = its trajectory consumer hands out messages again
    await _kill_consumer_service(
        "warehouse ingester",
        "warehouse_ingester",
        procs["warehouse"],
        grows_from=lambda: delivered(bus, "RL_TRAJECTORIES", "warehouse-trajectory"),
        consumer=(bus, "RL_TRAJECTORIES", "warehouse-trajectory"),
        agents=agents,
        cfg=cfg,
        result=result,
        say=say,
    )

    # 3. a running training job's process
    await _kill_job(cfg, procs["training"], http, api, result, say)
    # 3b. the training service itself while a job runs
    await _kill_training_service(cfg, procs["training"], http, api, result, say)

    # 4. nats-server
    # back = each client does its job again: publishes, or pulls from its durable consumer
    threshold = await threshold_durable(bus)
    marks = {
        "agents publish": (lambda: last_seq(bus, "RL_TRAJECTORIES")),
        "reward service": (lambda: last_seq(bus, "RL_REWARDS")),
        "gateway completion log": (lambda: last_seq(bus, "RL_COMPLETIONS")),
        "warehouse ingester": (lambda: delivered(bus, "RL_TRAJECTORIES", "warehouse-trajectory")),
        "training service": (lambda: delivered(bus, "RL_REWARDS", threshold)),
    }
    # what the consumers had in hand when the server died: their acks may be lost with it,
    # then the server redelivers them after each consumer's ack_wait
    durables = [
        ("RL_TRAJECTORIES", "rewards"),
        ("RL_TRAJECTORIES", "warehouse-trajectory"),
        ("RL_REWARDS", "warehouse-reward"),
        ("RL_REWARDS", threshold),
    ]
    burst = Burst(bus, agents)
    bursting = asyncio.create_task(burst.run(cfg.burst, pause=0.1))
    await wait_for(lambda: _true(burst.sent >= cfg.burst // 3), 60, 0.02)
    before = {k: await get() for k, get in marks.items()}
    taken = {d: await delivered_seq(bus, *d) for d in durables}
    errors_before = sum(agents.counts.errors.values())
    t0 = time.monotonic()
    server.kill()
    say(f"soak: nats-server SIGKILLed ({burst.sent} of a burst of {cfg.burst} published)")
    await asyncio.sleep(cfg.restart_delay_s)
    server.start()
    rec["nats_server"] = time.monotonic() - t0
    say(f"soak: nats-server back on the same port and store after {rec['nats_server']:.1f}s")

    async def client(name: str, get: Callable[[], Any]) -> None:
        got = await wait_for(grows(get, before[name]), t)
        rec[f"nats: {name}"] = _since(t0, got)
        say(f"soak:   {name} reconnected after {_fmt(rec[f'nats: {name}'])}")

    async def control_api() -> None:
        got = await wait_for(lambda: _http_ok(http, f"{api}/training"), t)
        rec["nats: control API"] = _since(t0, got)
        say(f"soak:   control API answering from KV after {_fmt(rec['nats: control API'])}")

    async def redelivered() -> None:
        async def done() -> bool:
            for d in durables:
                floor = await ack_floor(bus, *d)
                if floor is None or floor < (taken[d] or 0):
                    return False
            return True

        got = await wait_for(done, t)
        rec["nats: unacked in-flight redelivered"] = _since(t0, got)
        say(
            "soak:   every consumer's in-flight messages done after "
            f"{_fmt(rec['nats: unacked in-flight redelivered'])}"
        )

    await asyncio.gather(*(client(k, g) for k, g in marks.items()), control_api(), redelivered())
    await bursting
    result.figures["burst_publish_retries"] = burst.retries
    result.figures["gateway_errors_during_nats_kill"] = (
        sum(agents.counts.errors.values()) - errors_before
    )

    # 4b. nats-server down for a minute while a training job ends
    await _nats_down_while_a_job_ends(cfg, bus, server, procs["training"], http, api, result, say)

    # 5. the deployment controller + gateway: the agents see an outage (counted), then the
    # restarted gateway serves the same versions from the registry
    await _kill_gateway(cfg, procs["deploy"], http, agents, result, say)

    # 6. the deployment controller SIGKILLed in the middle of a rollback and of a promotion
    if cfg.release_kills:
        await _kill_controller_mid_release(
            cfg, procs["deploy"], bus, http, api, agents, result, say
        )


async def _kill_gateway(
    cfg: SoakConfig,
    deploy: ServiceProc,
    http: httpx.AsyncClient,
    agents: SoakAgents,
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    gateway = agents.gateway_url
    before = set(await _model_ids(http, gateway))
    errors_before = sum(agents.counts.errors.values())
    t0 = time.monotonic()
    children = deploy.kill()
    say("soak: deployment controller + gateway SIGKILLed")
    await asyncio.sleep(cfg.restart_delay_s)
    restarted = time.monotonic()
    deploy.start()
    await _orphans("deployment controller + gateway", children, result, say)
    got = await wait_for(
        lambda: _true(agents.counts.last_ok_at > restarted), cfg.recover_timeout_s, 0.1
    )
    result.recovery_s["gateway"] = _since(t0, got)
    errors = sum(agents.counts.errors.values()) - errors_before
    result.figures["gateway_errors_during_gateway_kill"] = errors
    result.checks["the gateway outage was seen and counted"] = errors > 0

    # A fresh gateway loads what the registry says is serving now (the public name, the live
    # version, a canary); earlier versions it kept loaded for a fast rollback are not reloaded.
    async def serves_registry() -> bool:
        want = await _serving_now(agents)
        return bool(want) and want <= set(await _model_ids(http, gateway))

    ok = await wait_for(serves_registry, 60, 0.5)
    want, after = await _serving_now(agents), set(await _model_ids(http, gateway))
    result.checks["the restarted gateway serves the registry's live and canary versions"] = (
        ok is not None
    )
    say(
        f"soak: gateway answering the agents again after {_fmt(result.recovery_s['gateway'])}; "
        f"{errors} client errors counted meanwhile; served before {sorted(before)}, after "
        f"{sorted(after)} (registry: {sorted(want)})"
    )


# ---- 6. the deployment controller killed between the writes of a rollback and a promote -------


async def _kill_controller_mid_release(
    cfg: SoakConfig,
    deploy: ServiceProc,
    bus: Any,
    http: httpx.AsyncClient,
    api: str,
    agents: SoakAgents,
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    """The deployment controller is restarted with `AGENTRL_DEPLOY_PAUSE_AT` (it stops dead
    between two registry writes of that action) and SIGKILLed there, once in a rollback (a
    canary whose checkpoint is missing: the gateway refuses it, the controller's process rolls
    it back) and once in a promotion (a canary of the base weights, promoted by the monitor
    under tolerances that pass at `min_samples`). Restarted plainly, it must finish each: the
    rolled-back version never comes back, no rollout stays half-done, and the registry's split
    is what the gateway reports serving."""
    from agentrl.release.actions import Deployer
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry

    registry = await Registry.open(bus.js, DeploySettings().bucket)
    kill = _ReleaseKill(
        cfg,
        deploy,
        registry,
        Deployer(registry, bus, agents.public),
        http,
        api,
        agents,
        result,
        say,
    )
    # (the controller restarted after the rollback's kill is already set for the promotion:
    # one restart less; it finishes the rollback first all the same)
    permissive = {
        "AGENTRL_DEPLOY_MAX_REWARD_DROP": "2.0",
        "AGENTRL_DEPLOY_MAX_ERROR_INCREASE": "1.0",
    }
    for_rollback, rollback_marker = kill.paused_at("rollback:split")
    for_promote, promote_marker = kill.paused_at("promote:split", permissive)
    await kill.restart(for_rollback)
    await kill.rollback(rollback_marker, then=for_promote)
    await kill.promotion(promote_marker, then=kill.plain)


@dataclass
class _ReleaseKill:
    """The steps of `_kill_controller_mid_release` over one registry and controller process."""

    cfg: SoakConfig
    deploy: ServiceProc
    registry: Any
    deployer: Any
    http: httpx.AsyncClient
    api: str
    agents: SoakAgents
    result: SoakResult
    say: Callable[[str], None]

    def __post_init__(self) -> None:
        self.plain = dict(self.deploy.env)  # the controller's own environment
        self.t = self.cfg.recover_timeout_s

    async def rollback(self, marker: Path, then: dict[str, str]) -> None:
        """A version the gateway cannot prepare (its checkpoint is missing), cut mid-rollback:
        the restarted controller finishes the rollback and never ramps it again."""
        registry, result = self.registry, self.result
        bad = await self.candidate(str(self.deploy.log.parent / "no-such-checkpoint"))
        rolled, t0 = await self.cut("rollback", "rollback:split", marker, bad, then)
        if rolled is None or t0 is None:
            return

        async def rolled_back() -> bool:
            return (await registry.require_model(rolled)).state == "rolled_back"

        await self.settled("rollback", rolled_back, t0)
        never = True
        for _ in range(8):  # several monitor periods: it is not ramped again
            split, _ = await registry.get_split(self.agents.public)
            record = await registry.require_model(rolled)
            never = never and record.state == "rolled_back"
            never = never and split is not None and rolled not in split.weights
            await asyncio.sleep(0.5)
        result.checks["rollback: the rolled-back version is never live again"] = never
        self.say(f"soak:   rollback of {rolled} finished by the restarted controller: {never}")

    async def promotion(self, marker: Path, then: dict[str, str]) -> None:
        """A canary of the base weights, cut mid-promotion: the monitor promotes it
        (tolerances of the whole range make every check pass once both versions have
        `min_samples`) and the restarted controller finishes, leaving it alone live."""
        registry, public = self.registry, self.agents.public
        good = await self.candidate(None)
        promoted, t0 = await self.cut("promotion", "promote:split", marker, good, then)
        if promoted is None or t0 is None:
            return

        async def live() -> bool:
            record = await registry.require_model(promoted)
            split, _ = await registry.get_split(public)
            return record.state == "live" and split is not None and split.live == promoted

        await self.settled("promotion", live, t0)
        split, _ = await registry.get_split(public)
        self.result.checks["promotion: the promoted version is live and serves alone"] = (
            split is not None and split.weights == {promoted: 100.0}
        )
        self.say(f"soak:   promotion of {promoted} finished by the restarted controller")

    async def restart(self, env: dict[str, str]) -> float:
        """SIGKILL the controller's process, start it with `env`; -> when it was killed."""
        deploy = self.deploy
        children = deploy.kill()
        t0 = time.monotonic()
        deploy.env = env
        deploy.start()
        await _orphans("deployment controller (release)", children, self.result, self.say)
        await wait_for(
            lambda: _http_ok(self.http, f"{self.agents.gateway_url}/models"), self.t, 0.5
        )
        return t0

    async def idle(self) -> bool:
        """No rollout in flight: a new one may start (a trained version's canary is rolled
        back to make room)."""
        rollout = await self.registry.get_rollout(self.agents.public)
        if rollout is None or rollout.status in ("promoted", "rolled_back"):
            return True
        if rollout.status == "running":  # a trained version's canary: make room
            with contextlib.suppress(httpx.HTTPError):
                await self.http.post(
                    f"{self.api}/deploy/rollback", json={"reason": "soak: make room"}
                )
        return False

    async def deploy_version(self, model_id: str) -> bool:
        for _ in range(5):  # a trained candidate may start between the look and the deploy
            await wait_for(self.idle, self.t, 0.5)
            r = await self.http.post(
                f"{self.api}/deploy/deploy",
                json={"model_id": model_id, "reason": "soak: release kill"},
            )
            if r.status_code == 200:
                return True
            self.say(f"soak:   deploy of {model_id} refused ({r.status_code}): retrying")
        return False

    async def candidate(self, path: str | None) -> str:
        """A registered version at `path`; None: the base weights under a version of their
        own (it serves)."""
        record = await self.deployer.register(
            checkpoint_path=path or "",
            base_model=self.cfg.model,
            sha256="0" * 64 if path else "",
            training_job_id=f"soak-release-{uuid.uuid4()}",
            by="soak",
        )
        if path is None:  # the base weights under a version of their own: it serves
            await self.registry.update_model(
                record.model_id, lambda r: setattr(r, "checkpoint_path", None)
            )
        return record.model_id

    def paused_at(
        self, point: str, extra: dict[str, str] | None = None
    ) -> tuple[dict[str, str], Path]:
        """The controller's environment to stop at `point`, and the file it marks it with."""
        from agentrl.release.actions import PAUSE_AT_ENV, PAUSE_FILE_ENV

        marker = self.deploy.log.parent / f"paused-{point.replace(':', '-')}"
        env = {**self.plain, **(extra or {}), PAUSE_AT_ENV: point, PAUSE_FILE_ENV: str(marker)}
        return env, marker

    async def cut(
        self, what: str, point: str, marker: Path, model_id: str, then: dict[str, str]
    ) -> tuple[str | None, float | None]:
        """Deploy `model_id` (the controller runs set to stop at `point`), SIGKILL it there,
        restart it with `then`; -> (the version the cut action was about, when killed)."""
        result = self.result
        if not await self.deploy_version(model_id):
            result.checks[f"{what}: the soak could deploy its version"] = False
            await self.restart(then)
            return None, None
        reached = await wait_for(lambda: _true(marker.exists()), 240, 0.2)
        result.checks[f"{what}: the controller reached {point}"] = reached is not None
        if reached is None:
            await self.restart(then)
            return None, None
        rollout = await self.registry.get_rollout(self.agents.public)
        cut_off = None
        if rollout is not None:
            cut_off = rollout.bad if rollout.status == "rolling_back" else rollout.target
        result.checks[f"{what}: a half-done action was left in the registry"] = (
            rollout is not None and rollout.status in ("promoting", "rolling_back")
        )
        t0 = await self.restart(then)
        self.say(
            f"soak: deployment controller SIGKILLed at {point} ({what} of {cut_off}); restarted"
        )
        return cut_off, t0

    async def agree(self) -> bool:
        """The registry's split is what the running gateway reports serving (a killed
        one's report ages out)."""
        split, _ = await self.registry.get_split(self.agents.public)
        reports = await self.registry.serving_reports(self.agents.public)
        newest = max(reports, key=lambda r: r.at, default=None)
        return split is not None and newest is not None and newest.weights == split.weights

    async def not_stuck(self) -> bool:
        rollout = await self.registry.get_rollout(self.agents.public)
        return rollout is None or rollout.status not in ("promoting", "rolling_back")

    async def settled(self, what: str, done: Callable[[], Any], t0: float) -> None:
        """The restarted controller finished `what`: its recovery time, no rollout stuck,
        registry and gateway agree."""
        result, t = self.result, self.t
        got = await wait_for(done, t, 0.25)
        result.recovery_s[f"controller killed mid-{what}"] = _since(t0, got)
        result.checks[f"{what}: no rollout stuck after the restart"] = (
            await wait_for(self.not_stuck, t, 0.25) is not None
        )
        result.checks[f"{what}: registry and gateway agree"] = (
            await wait_for(self.agree, 60, 0.5) is not None
        )


async def _serving_now(agents: SoakAgents) -> set[str]:
    """The public name plus the live and canary versions, from the registry (NATS KV)."""
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry

    try:
        registry = await Registry.open(agents.bus.js, DeploySettings().bucket)
        split, _ = await registry.get_split(agents.public)
    except Exception:
        return set()
    if split is None:
        return {agents.public}
    return {agents.public} | {m for m in (split.live, split.canary) if m}


async def _model_ids(http: httpx.AsyncClient, gateway: str) -> list[str]:
    try:
        r = await http.get(f"{gateway}/models")
        return [str(m["id"]) for m in r.json().get("data", [])]
    except (httpx.HTTPError, ValueError):
        return []


async def _kill_consumer_service(
    name: str,
    key: str,
    proc: ServiceProc,
    *,
    grows_from: Callable[[], Any],
    consumer: tuple[Any, str, str],
    agents: SoakAgents,
    cfg: SoakConfig,
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    bus, stream, durable = consumer
    start = await delivered(bus, stream, durable) or 0
    burst = Burst(bus, agents)
    bursting = asyncio.create_task(burst.run(cfg.burst))

    # kill while the service has part of the burst in hand (fetched, not yet acked)
    async def in_hand() -> bool:
        got = await delivered(bus, stream, durable)
        if got is None or got <= start:
            return False
        taken, floor = (
            await delivered_seq(bus, stream, durable),
            await ack_floor(bus, stream, durable),
        )
        return taken is not None and floor is not None and taken > floor

    await wait_for(in_hand, 60, 0.005)
    mark = await grows_from()
    taken = await delivered_seq(bus, stream, durable)
    floor_at_kill = await ack_floor(bus, stream, durable)
    t0 = time.monotonic()
    children = proc.kill()
    result.figures[f"{key}_unacked_at_kill"] = max(0, (taken or 0) - (floor_at_kill or 0))
    await asyncio.sleep(cfg.restart_delay_s)
    proc.start()

    async def back() -> None:
        got = await wait_for(grows(grows_from, mark), cfg.recover_timeout_s)
        result.recovery_s[key] = _since(t0, got)

    async def inflight() -> None:
        async def done() -> bool:
            floor = await ack_floor(bus, stream, durable)
            return floor is not None and taken is not None and floor >= taken

        got = await wait_for(done, cfg.recover_timeout_s)
        result.recovery_s[f"{key}_inflight_redelivered"] = _since(t0, got)

    await asyncio.gather(back(), inflight(), bursting)
    say(
        f"soak: {name} SIGKILLed; back after {_fmt(result.recovery_s[key])}, its unacked "
        f"in-flight messages done after {_fmt(result.recovery_s[f'{key}_inflight_redelivered'])}"
    )
    await _orphans(name, children, result, say)


async def _running_job(
    cfg: SoakConfig, training: ServiceProc, http: httpx.AsyncClient, api: str, min_step: int = 0
) -> tuple[Any, str | None]:
    """A running job's worker process (alive for a second at least, past `min_step` optimiser
    steps) and its job id."""
    import psutil

    deadline = time.monotonic() + cfg.job_wait_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        with contextlib.suppress(Exception):
            running = (await http.get(f"{api}/training", params={"status": "running"})).json()
            jobs = [
                j
                for j in running.get("jobs", [])
                if int((j.get("progress") or {}).get("current_step") or 0) >= min_step
            ]
            if not jobs:
                continue
            # the job process is a direct child (a helper it forked carries the same cmdline);
            # one started ahead (`--spare`) names its job in the files it holds open only
            for child in psutil.Process(training.pid).children(recursive=False):
                cmd = " ".join(child.cmdline())
                if "agentrl.training.worker" in cmd and time.time() - child.create_time() > 1.0:
                    for j in jobs:
                        job_id = str(j.get("training_job_id"))
                        if (
                            job_id in cmd
                            or (len(jobs) == 1 and "--spare" not in cmd)
                            or any(job_id in f.path for f in child.open_files())
                        ):
                            return child, job_id
    return None, None


async def _kill_training_service(
    cfg: SoakConfig,
    training: ServiceProc,
    http: httpx.AsyncClient,
    api: str,
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    """SIGKILL the training service while a job runs: its worker must die with it, and the
    restarted service must resume the job from its checkpoint or fail it, never leave it
    'running'."""
    rec = result.recovery_s
    # past two optimiser steps: a step checkpoint exists (AGENTRL_TRAINING_SAVE_INTERVAL=1)
    worker, job_id = await _running_job(cfg, training, http, api, min_step=2)
    if worker is None or job_id is None:
        result.notes.append(f"no training job ran within {cfg.job_wait_s:.0f}s: service not killed")
        rec["training_service"] = None
        return
    before = (await http.get(f"{api}/training/{job_id}/status")).json()
    t0 = time.monotonic()
    children = training.kill()
    say(f"soak: training service SIGKILLed while job {job_id[:8]} ran (worker pid {worker.pid})")
    await asyncio.sleep(cfg.restart_delay_s)
    training.start()
    await _orphans("training service", children, result, say)

    async def decided() -> bool:
        # queued (resumes from its checkpoint), failed, or any status written after the kill
        # (only the restarted service writes one)
        now = (await http.get(f"{api}/training/{job_id}/status")).json()
        return now.get("status") != "running" or (
            now.get("timestamp") != before.get("timestamp") and _after(now, t0)
        )

    got = await wait_for(decided, cfg.recover_timeout_s)
    rec["training_service"] = _since(t0, got)
    status = (await http.get(f"{api}/training/{job_id}/status")).json().get("status")
    say(
        f"soak: training service back; job {job_id[:8]} is {status} after {_fmt(rec['training_service'])}"
    )

    async def settled() -> bool:
        now = (await http.get(f"{api}/training/{job_id}/status")).json()
        return now.get("status") in ("completed", "failed", "cancelled")

    got = await wait_for(settled, cfg.job_wait_s, 0.5)
    rec["training_service_job_settled"] = _since(t0, got)
    final = (await http.get(f"{api}/training/{job_id}/status")).json()
    result.figures["job_after_service_kill"] = final.get("status")
    say(
        f"soak: job {job_id[:8]} ended {final.get('status')} "
        f"{_fmt(rec['training_service_job_settled'])} after the service kill"
    )


async def _kill_job(
    cfg: SoakConfig,
    training: ServiceProc,
    http: httpx.AsyncClient,
    api: str,
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    rec = result.recovery_s
    job_id: str | None = None
    got: float | None = None
    t0 = time.monotonic()

    async def status_of() -> str | None:
        r = await http.get(f"{api}/training/{job_id}/status")
        return r.json().get("status") if r.status_code == 200 else None

    async def concluded() -> bool:
        return await status_of() in ("failed", "completed", "cancelled")

    for _attempt in range(3):  # a job can finish between the look and the kill: next one
        victim, job_id = await _running_job(cfg, training, http, api)
        if victim is None or job_id is None:
            result.notes.append(f"no training job ran within {cfg.job_wait_s:.0f}s: not killed")
            break
        t0 = time.monotonic()
        victim.kill()
        say(f"soak: training job {job_id[:8]}'s process (pid {victim.pid}) SIGKILLed")
        got = await wait_for(concluded, cfg.recover_timeout_s)
        if got is not None and await status_of() == "completed":
            say(f"soak: job {job_id[:8]} had completed before the kill landed; the next one")
            got = None
            continue
        break
    rec["training_job_failed"] = _since(t0, got)
    result.checks["the killed job was marked failed"] = got is not None
    result.checks["training service survived the job kill"] = training.alive()
    say(
        f"soak: job {str(job_id)[:8]} marked failed after {_fmt(rec['training_job_failed'])}; "
        f"training service alive: {training.alive()}"
    )

    async def next_job() -> bool:
        listed = (await http.get(f"{api}/training")).json().get("jobs", [])
        return any(
            j.get("training_job_id") != job_id
            and j.get("status") in ("running", "completed")
            and _after(j, t0)
            for j in listed
        )

    got = await wait_for(next_job, cfg.job_wait_s, 0.5)
    rec["training_next_job"] = _since(t0, got)
    say(f"soak: the next training job ran {_fmt(rec['training_next_job'])} after the kill")


async def _nats_down_while_a_job_ends(
    cfg: SoakConfig,
    bus: Any,
    server: Any,
    training: ServiceProc,
    http: httpx.AsyncClient,
    api: str,
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    """nats-server stopped for `nats_down_s` (longer than the bus's publish retry window)
    while a training job ends (on its own, or SIGKILLed half-way through the outage).
    Afterwards the job's final status must be on RL_TRAINING and a new request must start:
    the training service's scheduler outlived the failed publishes."""
    from agentrl.training.dataset import read_subject

    rec = result.recovery_s
    worker, job_id = await _running_job(cfg, training, http, api)
    if worker is None or job_id is None:
        result.notes.append(f"no training job ran within {cfg.job_wait_s:.0f}s: nats not stopped")
        rec["nats down: final status on the stream"] = None
        return
    t0 = time.monotonic()
    server.stop()
    say(f"soak: nats-server stopped for {cfg.nats_down_s:.0f}s while job {job_id[:8]} runs")
    half = t0 + cfg.nats_down_s / 2

    def running() -> bool:
        try:
            return bool(worker.is_running() and worker.status() != "zombie")
        except Exception:  # reaped by the training service
            return False

    while running() and time.monotonic() < half:
        await asyncio.sleep(0.5)
    if running():
        with contextlib.suppress(Exception):
            worker.kill()
        say(f"soak:   job {job_id[:8]}'s process SIGKILLed while nats-server is away")
    else:
        say(f"soak:   job {job_id[:8]} ended on its own while nats-server is away")
    await asyncio.sleep(max(0.0, t0 + cfg.nats_down_s - time.monotonic()))
    server.start()
    t_back = time.monotonic()
    say(f"soak: nats-server back after {t_back - t0:.0f}s")

    async def final_on_stream() -> bool:
        raw = await read_subject(bus.js, "RL_TRAINING", "agent.rl.training.status.v1")
        mine = [json.loads(m) for m in raw if job_id.encode() in m]
        mine = [e for e in mine if e.get("training_job_id") == job_id]
        return bool(mine) and mine[-1].get("status") in ("completed", "failed", "cancelled")

    got = await wait_for(final_on_stream, cfg.recover_timeout_s, 1.0)
    rec["nats down: final status on the stream"] = on_stream = _since(t_back, got)
    result.checks["nats down while a job ends: its final status reached RL_TRAINING"] = (
        got is not None
    )
    say(f"soak:   job {job_id[:8]}'s final status on the stream {_fmt(on_stream)} after")
    body = {"metadata": {"notes": "soak: the request after the nats outage"}}
    new_id: str | None = None
    for _ in range(30):  # the control API's bus reconnects too
        with contextlib.suppress(Exception):
            r = await http.post(
                f"{api}/training/start", json=body, headers={"Idempotency-Key": f"soak-{job_id}"}
            )
            if r.status_code == 202:
                new_id = str(r.json()["training_job_id"])
                break
        await asyncio.sleep(1.0)

    async def started() -> bool:
        r = await http.get(f"{api}/training/{new_id}/status")
        return r.status_code == 200 and r.json().get("status") not in (None, "queued")

    got = await wait_for(started, cfg.job_wait_s, 0.5) if new_id else None
    rec["nats down: next request started"] = next_start = _since(t_back, got)
    result.checks["nats down while a job ends: the next request started"] = got is not None
    result.checks["training service survived the nats outage"] = training.alive()
    say(f"soak:   the next request started {_fmt(next_start)} after nats came back")


def _after(job: dict[str, Any], t0_monotonic: float) -> bool:
    """Whether a job's latest status is newer than the kill (wall clock from monotonic)."""
    ts = job.get("timestamp")
    if not ts:
        return True
    kill_wall = time.time() - (time.monotonic() - t0_monotonic)
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp() > kill_wall
    except ValueError:
        return True


async def _drain(
    cfg: SoakConfig,
    bus: Any,
    http: httpx.AsyncClient,
    api: str,
    agents: SoakAgents,
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    """Until the rewards, the ingester and the job queue have caught up (bounded)."""
    t0 = time.monotonic()
    durables = [
        ("RL_TRAJECTORIES", "rewards"),
        ("RL_TRAJECTORIES", "warehouse-trajectory"),
        ("RL_REWARDS", "warehouse-reward"),
        ("RL_TRAINING", "warehouse-training-status"),
    ]

    async def caught_up() -> bool:
        for stream, durable in durables:
            if not await consumer_idle(bus, stream, durable):
                return False
        listed = (await http.get(f"{api}/training")).json().get("jobs", [])
        return not any(j.get("status") in ACTIVE for j in listed)

    got = await wait_for(caught_up, cfg.drain_timeout_s, 0.5)
    result.figures["drain_s"] = round(time.monotonic() - t0, 1)
    result.checks["caught up after the run (rewards, ingester, job queue)"] = got is not None
    say(
        f"soak: drained in {result.figures['drain_s']}s"
        + ("" if got is not None else " (timed out)")
    )


async def _check_streams(
    bus: Any, agents: SoakAgents, result: SoakResult, say: Callable[[str], None]
) -> None:
    from agentrl.app.report import read_stream

    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    trajectories = await read_stream(bus, "RL_TRAJECTORIES", epoch, limit=10_000_000)
    rewards = await read_stream(bus, "RL_REWARDS", epoch, limit=10_000_000)
    in_stream = Counter(str(t.get("trajectory_id")) for t in trajectories)
    per_version = Counter((str(r.get("trajectory_id")), reward_version(r)) for r in rewards)
    published = set(agents.published)
    rewarded = {tid for tid, _ in per_version}
    dup_traj = sum(n - 1 for n in in_stream.values() if n > 1)
    dup_rewards = sum(n - 1 for n in per_version.values() if n > 1)
    missing = len(published - rewarded)
    gaps = 0
    by_tid: dict[str, set[int]] = {}
    for tid, v in per_version:
        by_tid.setdefault(tid, set()).add(v)
    for versions in by_tid.values():
        gaps += int(versions != set(range(1, max(versions) + 1)))
    # Feedback for a scored trajectory makes version 2; feedback the service saw before the
    # trajectory is folded into version 1. Either way the latest version must carry it.
    latest: dict[str, dict[str, Any]] = {}
    for r in rewards:
        tid = str(r.get("trajectory_id"))
        if tid not in latest or reward_version(r) > reward_version(latest[tid]):
            latest[tid] = r
    as_v2 = sum(1 for tid in agents.feedback if max(by_tid.get(tid, {0})) >= 2)
    unapplied = sum(1 for tid in agents.feedback if _explicit(latest.get(tid)) != "thumbs_up")
    f = result.figures
    f.update(
        trajectories=len(published),
        burst_trajectories=agents.burst,
        stream_trajectories=len(in_stream),
        duplicate_trajectories=dup_traj,
        rewards=len(rewards),
        reward_versions=len(per_version),
        duplicate_rewards=dup_rewards,
        missing_rewards=missing,
        feedback=len(agents.feedback),
        feedback_as_version_2=as_v2,
        feedback_not_in_latest_reward=unapplied,
    )
    result.checks["every feedback is in its trajectory's latest reward"] = unapplied == 0
    result.checks["every published trajectory is in the stream once"] = (
        published <= set(in_stream) and dup_traj == 0
    )
    result.checks["exactly one reward per trajectory and version"] = (
        missing == 0 and dup_rewards == 0 and gaps == 0
    )
    say(
        f"soak: streams: {len(published)} published, {len(in_stream)} in RL_TRAJECTORIES "
        f"({dup_traj} duplicates); {len(rewards)} rewards for {len(per_version)} "
        f"(trajectory, version) pairs: {dup_rewards} duplicates, {missing} missing, {gaps} gaps"
    )
    feedback = await read_stream(bus, "RL_FEEDBACK", epoch, limit=10_000_000)
    result.figures["_stream_counts"] = (
        len(in_stream),
        len(per_version),
        len({str(x.get("feedback_id")) for x in feedback}),
    )


def _explicit(reward: dict[str, Any] | None) -> str | None:
    """The explicit user feedback a reward was computed with (metadata.feedback.explicit)."""
    meta = (reward or {}).get("metadata") or {}
    fb = meta.get("feedback") if isinstance(meta, dict) else None
    return fb.get("explicit") if isinstance(fb, dict) else None


async def _settled_jobs(cfg: SoakConfig, http: httpx.AsyncClient, api: str) -> list[Any]:
    """The job list once no job is queued or running (bounded): a threshold reached during
    the last job starts one more after the drain, which is work, not a stuck job; a job that
    never ends within the drain timeout is still reported as stuck."""

    async def listed() -> list[Any]:
        return list((await http.get(f"{api}/training")).json().get("jobs", []))

    async def settled() -> bool:
        return not any(j.get("status") in ACTIVE for j in await listed())

    await wait_for(settled, cfg.drain_timeout_s, 0.5)
    return await listed()


def _check_jobs(jobs: list[dict[str, Any]], result: SoakResult, say: Callable[[str], None]) -> None:
    by_status = Counter(str(j.get("status")) for j in jobs)
    stuck = sum(by_status[s] for s in ACTIVE)
    result.figures["jobs"] = dict(by_status)
    result.figures["stuck_jobs"] = stuck
    result.checks["no training job stuck"] = stuck == 0
    say(f"soak: training jobs by status {dict(by_status)}; stuck: {stuck}")


def _check_warehouse(settings: Any, result: SoakResult, say: Callable[[str], None]) -> None:
    from agentrl.warehouse.access import open_migrated
    from agentrl.warehouse.backend import close_backends
    from agentrl.warehouse.config import WarehouseSettings

    ws = WarehouseSettings()
    backend = open_migrated(settings, ws)
    db = ws.database
    try:
        t = backend.query(f"SELECT count() AS n FROM {db}.trajectories FINAL").to_pylist()[0]["n"]
        r = backend.query(
            f"SELECT count() AS n FROM (SELECT trajectory_id, version FROM {db}.rewards FINAL)"
        ).to_pylist()[0]["n"]
        fb = backend.query(f"SELECT count() AS n FROM {db}.feedback FINAL").to_pylist()[0]["n"]
        j = backend.query(
            f"SELECT uniqExact(training_job_id) AS n FROM {db}.training_jobs"
        ).to_pylist()[0]["n"]
    finally:
        close_backends()
    n_traj, n_rew, n_fb = result.figures.pop("_stream_counts", (None, None, None))
    n_jobs = sum(result.figures.get("jobs", {}).values())
    f = result.figures
    f["warehouse_trajectories"], f["warehouse_rewards"] = int(t), int(r)
    f["warehouse_feedback"], f["warehouse_jobs"] = int(fb), int(j)
    result.checks["warehouse counts match the streams"] = (int(t), int(r), int(fb), int(j)) == (
        n_traj,
        n_rew,
        n_fb,
        n_jobs,
    )
    say(
        f"soak: warehouse: {t} trajectories, {r} rewards, {fb} feedback, {j} jobs "
        f"(streams / control API: {n_traj}, {n_rew}, {n_fb}, {n_jobs})"
    )


def _check_gateway(agents: SoakAgents, result: SoakResult, say: Callable[[str], None]) -> None:
    c = agents.counts
    counted = c.ok + sum(c.errors.values())
    f = result.figures
    f["gateway_requests"] = c.requests
    f["gateway_ok"] = c.ok
    f["gateway_errors"] = dict(c.errors)
    f["critical_episodes"] = agents.critical_episodes
    f["publish_retries"] = agents.publish_retries
    f["publish_failed"] = agents.publish_failed
    f["group_errors"] = dict(agents.group_errors)
    result.checks["gateway answered (every request counted)"] = c.ok > 0 and counted == c.requests
    result.checks["no trajectory lost on publish"] = agents.publish_failed == 0
    say(
        f"soak: gateway: {c.requests} requests, {c.ok} ok, errors {dict(c.errors)}; "
        f"{agents.critical_episodes} episodes ended on an error; "
        f"{agents.publish_retries} publish retries, {agents.publish_failed} lost"
    )


async def _orphans(
    name: str, children: list[Any], result: SoakResult, say: Callable[[str], None]
) -> None:
    """After a SIGKILL the old process's children must exit by themselves within 10 s (a
    lingering one holds ports, locks and the store)."""
    import psutil

    def alive() -> list[Any]:
        out = []
        for c in children:
            with contextlib.suppress(psutil.Error):
                if c.is_running() and c.status() != psutil.STATUS_ZOMBIE:
                    out.append(c)
        return out

    t0 = time.monotonic()
    while alive() and time.monotonic() - t0 < 10:
        await asyncio.sleep(0.2)
    left = alive()
    result.checks[f"no orphan after the {name} kill"] = not left
    if left:
        names = ", ".join(f"{c.pid} {c.name()}" for c in left)
        result.notes.append(f"{name}: children alive 10 s after its SIGKILL: {names}")
        say(f"soak: {name}: orphans after SIGKILL: {names}")
        for c in left:
            with contextlib.suppress(psutil.Error):
                c.kill()


def _since(t0: float, got: float | None) -> float | None:
    return None if got is None else time.monotonic() - t0


def _fmt(s: float | None) -> str:
    return "never (timed out)" if s is None else f"{s:.1f}s"


def table(result: SoakResult) -> str:
    lines = [f"{'component':<42} back after"]
    for k, v in result.recovery_s.items():
        lines.append(f"{k:<42} {_fmt(v)}")
    lines.append("")
    for k, ok in result.checks.items():
        lines.append(f"{'PASS' if ok else 'FAIL'}  {k}")
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)


def main_json(result: SoakResult) -> str:
    return json.dumps(result.summary(), default=str)
