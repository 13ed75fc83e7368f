"""`agentrl soak --replicas 2 --cluster 3`: two of every service over a NATS cluster, one of
each kind SIGKILLed during the run, and one NATS node (a stream leader).

Each replica is what one host would run, as its own processes: reward service, warehouse
ingester, training runner and deployment controller + gateway, with its own data dir,
`AGENTRL_REPLICA_ID` and gateway port; training checkpoints go to one shared folder. Agents
act through every gateway (`openai` SDK, counted below it) and publish their episodes. During
the run the soak kills, once each: the training runner that runs a job (mid-job), a reward
service, a warehouse ingester, the active deployment controller (the holder of its lease) with
its gateway, and the NATS node that leads RL_TRAJECTORIES (restarted after a while). Killed
services are not restarted: the surviving replicas must do the work.

Afterwards: every trajectory has exactly one reward per version (RL_REWARDS), the surviving
warehouse equals the streams (an embedded chdb is per host, so each ingester replica keeps a
whole warehouse with consumers of its own; with a ClickHouse server they share consumers),
every job ended (none stuck) and the killed runner's job was resumed by the other, no
controller decision was recorded twice and the standby took the lease within seconds, the
gateways kept answering (errors counted). The last line is one JSON object.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agentrl.bench.soak import (
    LOG_FILE,
    ServiceProc,
    SoakAgents,
    SoakConfig,
    SoakResult,
    _check_streams,
    _check_warehouse,
    consumer_idle,
    soak_environment,
    wait_for,
)

ACTIVE = ("queued", "running")
FINAL = ("completed", "failed", "cancelled")
# decisions a controller takes once per rollout step (a second one means two acted)
ONCE = ("advance", "promote", "rollback", "set_weight", "escalate", "reject", "validate")
LAST_LINE_KEYS = (
    "ok",
    "replicas",
    "duplicate_rewards",
    "missing_rewards",
    "stuck_jobs",
    "jobs_resumed_elsewhere",
    "controller_failover_s",
    "gateway_errors",
    "lost",
)


# ---- checks (pure: unit-tested on hand-made data) -------------------------------------------


def duplicate_decisions(models: Iterable[Any]) -> list[tuple[str, str, Any, Any]]:
    """Decisions recorded twice: the same model, action, rollout and step (two controllers
    acting at once, or one repeating what a dead one did)."""
    seen: Counter[tuple[str, str, Any, Any]] = Counter()
    for m in models:
        for d in m.decisions:
            if d.action in ONCE:
                ev = d.evidence or {}
                seen[(m.model_id, d.action, ev.get("deployment_id"), ev.get("step"))] += 1
    return [k for k, n in seen.items() if n > 1]


@dataclass
class JobHistory:
    """Every status event of every job (RL_TRAINING), reduced to what the checks need."""

    last: dict[str, str] = field(default_factory=dict)
    runners: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, statuses: Iterable[dict[str, Any]]) -> JobHistory:
        h = cls()
        for s in statuses:
            job = str(s.get("training_job_id"))
            h.last[job] = str(s.get("status"))
            runner = (s.get("metadata") or {}).get("runner")
            if runner and s.get("status") == "running":
                seen = h.runners.setdefault(job, [])
                if not seen or seen[-1] != runner:
                    seen.append(str(runner))
        return h

    def stuck(self, current: dict[str, str] | None = None) -> list[str]:
        """Jobs whose latest status is queued or running (`current`: the status bucket's
        view, newer than the stream's when given)."""
        states = {**self.last, **(current or {})}
        return sorted(j for j, s in states.items() if s in ACTIVE)

    def resumed_elsewhere(self) -> list[str]:
        """Jobs run by more than one runner that ended."""
        return sorted(
            j for j, rs in self.runners.items() if len(set(rs)) > 1 and self.last.get(j) in FINAL
        )


@dataclass
class Drain:
    """When the stack has caught up after the run, from successive looks (pure).

    Caught up: every consumer idle, no job queued or running, and the streams still for
    `still_s`. Idle and no active job at one look is not enough: a threshold reached while
    a job ran fires one follow-up job when that job ends, and its request lands a moment
    after the final status (later still on a loaded host). A look in between saw no job,
    and the check after the drain found the follow-up running: "stuck" (the soak at load
    6.5). Work that moves (a new message on a stream: a reward, a job's progress, a status,
    a request) is waited for; `quiet_s` with nothing moving while work is left is a stuck
    stack; `cap_s` bounds the whole wait."""

    quiet_s: float
    cap_s: float
    still_s: float = 3.0
    started: float | None = None
    moved_at: float = 0.0
    marks: tuple[int, ...] | None = None
    waited_for: dict[str, str] = field(default_factory=dict)  # job id -> last state seen
    busy_seen: set[str] = field(default_factory=set)  # consumers seen behind
    # looks that saw every consumer idle and no job, after which work still came (a
    # consumer behind, a job): the drain before this one ended at the first of them
    idle_then_more: int = 0
    _idle_looks: int = 0

    def look(
        self, now: float, busy: Iterable[str], active: dict[str, str], marks: tuple[int, ...]
    ) -> str | None:
        """One look: `busy` the consumers with messages pending, `active` the jobs queued or
        running (id -> status), `marks` the streams' last sequence numbers. Returns
        'caught up', 'stuck' (nothing moved for `quiet_s`), 'capped' (`cap_s` passed while
        work still moved) or None (look again)."""
        busy = sorted(busy)
        if self.started is None:
            self.started = now
        if marks != self.marks:
            self.marks, self.moved_at = marks, now
        self.busy_seen.update(busy)
        if busy or active:
            self.idle_then_more += self._idle_looks
            self._idle_looks = 0
        else:
            self._idle_looks += 1
        for job, status in active.items():
            self.waited_for[job] = status
        for job in self.waited_for.keys() - active.keys():
            if self.waited_for[job] in ACTIVE:
                self.waited_for[job] = "ended"
        still = now - self.moved_at
        if not busy and not active and still >= self.still_s:
            return "caught up"
        if still >= self.quiet_s:
            return "stuck"
        if now - self.started >= self.cap_s:
            return "capped"
        return None

    def waited(self) -> str:
        """What the drain waited for, in words."""
        parts = [f"job {j} ({s})" for j, s in self.waited_for.items()]
        if self.busy_seen:
            parts.append("consumers " + ", ".join(sorted(self.busy_seen)))
        return "; ".join(parts) or "nothing"


def last_line(result: SoakResult, replicas: int) -> dict[str, Any]:
    """The soak's last JSON line: the keys the issue names, then the rest of the figures."""
    f = result.figures
    head = {
        "ok": result.ok,
        "replicas": replicas,
        "duplicate_rewards": f.get("duplicate_rewards"),
        "missing_rewards": f.get("missing_rewards"),
        "stuck_jobs": f.get("stuck_jobs"),
        "jobs_resumed_elsewhere": f.get("jobs_resumed_elsewhere"),
        "controller_failover_s": f.get("controller_failover_s"),
        "gateway_errors": f.get("gateway_errors_total"),
        "lost": f.get("lost"),
    }
    rest = {k: v for k, v in result.summary().items() if k not in head}
    return {**head, **rest}


# ---- the run --------------------------------------------------------------------------------


@dataclass
class Replica:
    index: int
    data_dir: Path
    gateway_port: int
    procs: dict[str, ServiceProc]

    @property
    def name(self) -> str:
        return f"replica-{self.index}"

    @property
    def gateway(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}/v1"


def replica_env(base: dict[str, str], data: Path, i: int, gw_port: int) -> dict[str, str]:
    return {
        **base,
        "AGENTRL_DATA_DIR": str(data / f"replica-{i}"),
        "AGENTRL_REPLICA_ID": f"replica-{i}",
        "AGENTRL_GATEWAY_PORT": str(gw_port),
        "AGENTRL_WAREHOUSE_DURABLE_PREFIX": f"warehouse-r{i}",
    }


def _replicas(cfg: SoakConfig, url: str, data: Path, count: int, streams: int) -> list[Replica]:
    import sys

    from agentrl.bus.server import free_port

    exe = str(Path(sys.executable).parent / "agentrl")
    base = {
        **os.environ,
        **soak_environment(cfg),
        "NATS_URL": url,
        "AGENTRL_NATS_URL": url,
        "AGENTRL_STREAM_REPLICAS": str(streams),
        "AGENTRL_TRAINING_STORAGE_PATH": str(data / "shared" / "checkpoints"),
        "AGENTRL_TRAINING_LEASE_TTL_S": str(cfg.lease_ttl_s),
        "AGENTRL_DEPLOY_LEASE_TTL_S": str(cfg.lease_ttl_s),
        "AGENTRL_CAPTURE_ENABLED": "false",
    }
    out = []
    for i in range(count):
        port = free_port()
        env = replica_env(base, data, i, port)
        (data / f"replica-{i}").mkdir(parents=True, exist_ok=True)
        logs = data / "logs"
        argv = {
            "rewards": [exe, "rewards", "serve", "--nats-url", url],
            "warehouse": [exe, "warehouse", "serve", "--nats-url", url],
            "training": [exe, "train", "serve", "--nats", url],
            "deploy": [exe, "deploy", "serve", "--nats-url", url],
        }
        procs = {
            k: ServiceProc(f"{k} replica-{i}", a, env, logs / f"{k}-{i}.log")
            for k, a in argv.items()
        }
        out.append(Replica(i, data / f"replica-{i}", port, procs))
    return out


async def run_replicated_soak(cfg: SoakConfig, say: Callable[[str], None] = print) -> SoakResult:
    import logging

    from agentrl.bus.client import Bus
    from agentrl.bus.server import EmbeddedNats, NatsCluster
    from agentrl.core.settings import Settings
    from agentrl.serving.config import DeploySettings

    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    t_start = time.monotonic()
    data = Path(cfg.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    if any(p.name != LOG_FILE for p in data.iterdir()):
        raise ValueError(f"{data} is not empty: give the soak a fresh folder")
    (data / "logs").mkdir()
    nodes: Any = (
        NatsCluster(data / "cluster", size=cfg.nats_nodes)
        if cfg.nats_nodes > 1
        else EmbeddedNats(settings=Settings(data_dir=data / "nats", nats_url=None))
    )
    nodes.start()
    streams = min(3, cfg.nats_nodes)
    url = nodes.url
    os.environ.update(soak_environment(cfg))
    os.environ["AGENTRL_STREAM_REPLICAS"] = str(streams)
    replicas = _replicas(cfg, url, data, cfg.replicas, streams)
    result = SoakResult()
    result.figures["replicas"] = cfg.replicas
    public = DeploySettings().public_model
    agents: list[SoakAgents] = []
    acting: list[asyncio.Task[None]] = []
    stops: list[asyncio.Event] = []
    bus = None
    try:
        for r in replicas:
            for p in r.procs.values():
                p.start()
        settings = Settings(data_dir=data, nats_url=url, stream_replicas=streams)
        bus = await Bus.connect(url, settings=settings, name="agentrl-soak")
        import httpx

        async with httpx.AsyncClient(timeout=5.0) as http:
            for r in replicas:
                up = await wait_for(partial(_ok, http, f"{r.gateway}/models"), 300, 0.5)
                if up is None:
                    raise TimeoutError(f"the gateway of {r.name} did not answer within 300 s")
            say(f"soak: {cfg.replicas} replicas up in {time.monotonic() - t_start:.1f}s on {url}")
            for r in replicas:
                a = SoakAgents(cfg, bus, r.gateway, public)
                stop = asyncio.Event()
                agents.append(a)
                stops.append(stop)
                acting.append(asyncio.create_task(a.run(stop)))
            await _faults(cfg, bus, nodes, replicas, agents, stops, result, say)
            await asyncio.sleep(cfg.settle_s)
        for s in stops:
            s.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*acting, return_exceptions=True), 90)
        published = {k: v for a in agents for k, v in a.published.items()}
        say(f"soak: acting stopped; {len(published)} trajectories published")
        await _drain(cfg, bus, replicas, result, say)
        both = SimpleNamespace(
            published=published, feedback=set().union(*(a.feedback for a in agents)), burst=0
        )
        checks = {
            "streams": _check_streams(bus, both, result, say),  # type: ignore[arg-type]
            "jobs": _check_jobs(bus, result, say),
            "decisions": _check_decisions(bus, result, say),
        }
        for name, check in checks.items():
            try:
                await check
            except Exception as exc:  # one broken check must not hide the others
                result.checks[f"the {name} check ran"] = False
                result.notes.append(f"{name} check: {type(exc).__name__}: {exc}")
        _check_gateways(agents, result, say)
        for a in agents:
            await a.close()
        for r in replicas:
            for p in r.procs.values():
                p.stop()
        survivor = next(r for r in replicas if r.procs["warehouse"].starts and _alive_until_end(r))
        _check_warehouse(Settings(data_dir=survivor.data_dir), result, say)
        f = result.figures
        f["lost"] = int(f.get("missing_rewards") or 0) + sum(a.publish_failed for a in agents)
        if "controller_failover_s" in f:
            ok = f["controller_failover_s"] is not None
            result.checks["the standby controller took over within seconds"] = ok and (
                f["controller_failover_s"] <= cfg.lease_ttl_s * 3 + 10
            )
    finally:
        for s in stops:
            s.set()
        for t in acting:
            t.cancel()
        if bus is not None:
            with contextlib.suppress(Exception):
                await bus.close()
        for r in replicas:
            for p in r.procs.values():
                p.stop(5.0)
        nodes.stop()
    result.wall_s = time.monotonic() - t_start
    return result


def _alive_until_end(r: Replica) -> bool:
    return not getattr(r, "warehouse_killed", False)


async def _ok(http: Any, url: str) -> bool:
    return bool((await http.get(url)).status_code == 200)


async def _statuses(bus: Any) -> dict[str, dict[str, Any]]:
    from agentrl.training.kv import all_statuses

    return {str(s["training_job_id"]): s for s in await all_statuses(bus.js)}


async def _faults(
    cfg: SoakConfig,
    bus: Any,
    nodes: Any,
    replicas: list[Replica],
    agents: list[SoakAgents],
    stops: list[asyncio.Event],
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    by_name = {r.name: r for r in replicas}
    # 1. the runner of a job, mid-job: a job seen running for two seconds, or with a step
    # checkpoint in the shared storage (it resumes from it elsewhere; a job kind without
    # step checkpoints, such as a choice job, starts over there)
    from agentrl.training.service import latest_step_checkpoint

    shared = Path(cfg.data_dir).resolve() / "shared" / "checkpoints"
    job: dict[str, Any] | None = None
    first_seen: dict[str, float] = {}

    async def running() -> bool:
        nonlocal job
        for s in (await _statuses(bus)).values():
            runner = (s.get("metadata") or {}).get("runner")
            if s.get("status") != "running" or runner not in by_name:
                continue
            job_id = str(s["training_job_id"])
            seen = first_seen.setdefault(job_id, time.monotonic())
            saved = await asyncio.to_thread(latest_step_checkpoint, str(shared / job_id))
            if time.monotonic() - seen >= 2.0 or saved is not None:
                job = s
                return True
        return False

    got = await wait_for(running, cfg.job_wait_s, 0.2)
    if got is None or job is None:
        result.checks["a training job ran (to kill its runner)"] = False
        say("soak: no training job ran: the runner kill was skipped")
    else:
        victim = by_name[job["metadata"]["runner"]]
        victim.procs["training"].kill()
        result.figures["killed_runner_job"] = job["training_job_id"]
        say(f"soak: SIGKILLed training {victim.name} running job {job['training_job_id']}")
    # 2. a reward service and a warehouse ingester (of different replicas)
    await asyncio.sleep(2.0)
    replicas[0].procs["rewards"].kill()
    say(f"soak: SIGKILLed rewards {replicas[0].name}")
    loser = replicas[-1]
    loser.procs["warehouse"].kill()
    loser.warehouse_killed = True  # type: ignore[attr-defined]
    say(f"soak: SIGKILLed warehouse {loser.name}")
    # 3. the active controller (and its gateway): the standby takes the lease
    await asyncio.sleep(2.0)
    await _kill_controller(cfg, bus, replicas, stops, result, say)
    # 4. the NATS node leading RL_TRAJECTORIES (restarted after a while)
    if hasattr(nodes, "node_named"):
        await asyncio.sleep(2.0)
        info = await bus.js.stream_info("RL_TRAJECTORIES")
        leader = info.cluster.leader if info.cluster else None
        if leader:
            node = nodes.node_named(leader)
            node.kill()
            say(f"soak: SIGKILLed NATS node {leader} (stream leader)")
            t0 = time.monotonic()

            async def new_leader() -> bool:
                i = await bus.js.stream_info("RL_TRAJECTORIES")
                return bool(i.cluster and i.cluster.leader and i.cluster.leader != leader)

            took = await wait_for(new_leader, 60, 0.5)
            result.recovery_s["RL_TRAJECTORIES leader elected after its node's kill"] = took
            await asyncio.sleep(10.0)
            node.launch()
            await asyncio.to_thread(node.wait_ready, 30)
            say(f"soak: NATS node {leader} restarted ({time.monotonic() - t0:.1f}s after)")


async def _kill_controller(
    cfg: SoakConfig,
    bus: Any,
    replicas: list[Replica],
    stops: list[asyncio.Event],
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    import re

    from agentrl.bus.lease import holder, lease_bucket
    from agentrl.serving.config import DeploySettings

    kv = await lease_bucket(bus.js, cfg.lease_ttl_s, min(3, cfg.nats_nodes))
    key = "deploy." + re.sub(r"[^A-Za-z0-9_-]", "_", DeploySettings().public_model) + ".controller"
    active = await holder(kv, key)
    victim = next((r for r in replicas if active and active.startswith(r.name + "-")), None)
    if victim is None:
        result.checks["one deployment controller holds the lease"] = False
        say(f"soak: no controller lease holder found ({active!r})")
        return
    stops[victim.index].set()  # its agents' balancer would send them elsewhere
    victim.procs["deploy"].kill()
    t0 = time.monotonic()
    say(f"soak: SIGKILLed the active controller + gateway of {victim.name} ({active})")

    async def taken() -> bool:
        now = await holder(kv, key)
        return now is not None and now != active

    took = await wait_for(taken, cfg.lease_ttl_s * 3 + 30, 0.2)
    result.figures["controller_failover_s"] = round(took, 1) if took is not None else None
    result.recovery_s["controller lease taken by the standby"] = took
    say(f"soak:   standby holds the controller lease after {time.monotonic() - t0:.1f}s")


async def _drain(
    cfg: SoakConfig,
    bus: Any,
    replicas: list[Replica],
    result: SoakResult,
    say: Callable[[str], None],
) -> None:
    """Until the rewards, the ingester, the training runners (their requests and reward
    counts) and every job have caught up (`Drain`): nothing moving for `drain_timeout_s`
    is stuck; while work moves, at most three times that."""
    t0 = time.monotonic()
    survivor = next(r for r in replicas if _alive_until_end(r))
    prefix = f"warehouse-r{survivor.index}"
    durables = [
        ("RL_TRAJECTORIES", "rewards"),
        ("RL_TRAJECTORIES", f"{prefix}-trajectory"),
        ("RL_REWARDS", f"{prefix}-reward"),
        ("RL_TRAINING", f"{prefix}-training-status"),
        ("RL_TRAINING", "training"),  # requests not yet turned into queued jobs
    ]
    # the reward counts of the runners still alive (a follow-up job fires from them)
    durables += [
        ("RL_REWARDS", f"training-threshold-{r.name}")
        for r in replicas
        if r.procs["training"].alive()
    ]
    drain = Drain(quiet_s=cfg.drain_timeout_s, cap_s=cfg.drain_timeout_s * 3)
    verdict: str | None = None
    while verdict is None:
        try:
            busy = [d for stream, d in durables if not await consumer_idle(bus, stream, d)]
            statuses = await _statuses(bus)
            seqs = [
                int((await bus.js.stream_info(name)).state.last_seq)
                for name in ("RL_TRAJECTORIES", "RL_REWARDS", "RL_TRAINING")
            ]
            marks = tuple(seqs)
        except Exception as exc:  # a look that failed (a node restarting): look again
            say(f"soak: drain: cannot look ({type(exc).__name__}: {exc})")
            busy, statuses, marks = ["(no answer)"], {}, (-1, -1, -1)
        active = {j: str(s.get("status")) for j, s in statuses.items() if s.get("status") in ACTIVE}
        verdict = drain.look(time.monotonic(), busy, active, marks)
        if verdict is None:
            await asyncio.sleep(1.0)
    f = result.figures
    f["drain_s"] = round(time.monotonic() - t0, 1)
    f["drain"] = verdict
    f["drain_waited_for"] = drain.waited()
    f["drain_idle_looks_before_more_work"] = drain.idle_then_more
    result.checks["caught up after the run (rewards, ingester, job queue)"] = verdict == "caught up"
    say(f"soak: drain {verdict} after {f['drain_s']}s; waited for {drain.waited()}")


async def _check_jobs(bus: Any, result: SoakResult, say: Callable[[str], None]) -> None:
    from datetime import UTC, datetime

    from agentrl.app.report import read_stream

    events = await read_stream(bus, "RL_TRAINING", datetime(2000, 1, 1, tzinfo=UTC), 10_000_000)
    history = JobHistory.of(e for e in events if "training_job_id" in e and "status" in e)
    current = {j: str(s.get("status")) for j, s in (await _statuses(bus)).items()}
    stuck = history.stuck(current)
    resumed = history.resumed_elsewhere()
    f = result.figures
    f["jobs"] = dict(Counter(current.values()))
    f["stuck_jobs"] = len(stuck)
    f["jobs_resumed_elsewhere"] = len(resumed)
    result.checks["no training job stuck"] = not stuck
    killed = f.get("killed_runner_job")
    if killed:
        result.checks["the killed runner's job was resumed by another runner and ended"] = (
            killed in resumed
        )
    say(f"soak: jobs {f['jobs']}; stuck {stuck}; resumed elsewhere {resumed}")


async def _check_decisions(bus: Any, result: SoakResult, say: Callable[[str], None]) -> None:
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry

    ds = DeploySettings()
    registry = await Registry.open(bus.js, ds.bucket)
    models = await registry.list_models(ds.public_model)
    twice = duplicate_decisions(models)
    result.figures["decisions_recorded_twice"] = len(twice)
    result.checks["no controller decision recorded twice"] = not twice
    say(f"soak: registry: {len(models)} versions; decisions recorded twice: {twice}")


def _check_gateways(
    agents: list[SoakAgents], result: SoakResult, say: Callable[[str], None]
) -> None:
    f = result.figures
    errors: Counter[str] = Counter()
    for a in agents:
        errors.update(a.counts.errors)
    f["gateway_requests"] = sum(a.counts.requests for a in agents)
    f["gateway_ok"] = sum(a.counts.ok for a in agents)
    f["gateway_errors"] = dict(errors)
    f["gateway_errors_total"] = sum(errors.values())
    counted = f["gateway_ok"] + f["gateway_errors_total"]
    result.checks["the gateways answered (every request counted)"] = (
        f["gateway_ok"] > 0 and counted == f["gateway_requests"]
    )
    result.checks["no trajectory lost on publish"] = all(a.publish_failed == 0 for a in agents)
    say(
        f"soak: gateways: {f['gateway_requests']} requests, {f['gateway_ok']} ok, errors {dict(errors)}"
    )


def main_json(result: SoakResult, replicas: int) -> str:
    return json.dumps(last_line(result, replicas), default=str)
