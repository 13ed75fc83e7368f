"""Several gateway processes on one port: what they share and how.

Why: the gateway is one event loop on one core; at 1,000 requests/s a burst queues behind it
while a Rust peer (TensorZero) spreads it over every core. With `--gateway-workers N` the
deploy service's process serves the gateway as worker 0 and starts N-1 worker processes
(`agentrl.release.gateway_worker`); each binds the same address with SO_REUSEPORT (the kernel
spreads connections over the listeners) and has its own bus connection, registry reads and
completion log. What must agree between them, and how it does:

- the split and session stickiness: every process reads the same split from the registry
  (every 0.2 s, `ServingManager.run`) and a session's version is a hash of its key
  (`agentrl.serving.split`), never process-local state: one version whichever process answers;
- a rollback: the same poll, so every process stops routing to a rolled-back version within
  a poll period;
- the completion log: a request is answered by exactly one process, which logs it once under
  its completion id (the stream drops a republished id);
- the canary's evidence: the controller (in worker 0's process) reads per-version counters;
  each worker publishes its cumulative counters on a core NATS subject every `STATS_EVERY_S`
  and `FleetStats` sums them with the local ones (cumulative: a lost message costs nothing);
- Prometheus: workers inherit `PROMETHEUS_MULTIPROC_DIR` from `agentrl up`, so one scrape of
  `/metrics` merges every process's counters (prometheus_client's multiprocess mode).

Capture assembles an episode in the memory of one process, so workers refuse to start with
capture on (`check`); so do vLLM deployments (each worker would start its own vLLM).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from agentrl.serving.gateway import GatewayState, VersionStats

log = logging.getLogger(__name__)

WORKER_ENV = "AGENTRL_GATEWAY_WORKER"  # the worker's index (1..N-1); set in worker processes
STATS_ENV = "AGENTRL_GATEWAY_STATS_SUBJECT"  # where a worker publishes its counters
STATS_PREFIX = "agentrl.gateway.stats"
STATS_EVERY_S = 0.5
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
STEADY_S = 60.0  # a worker that ran this long before it died restarts after the first delay


class WorkersRefused(ValueError):
    """This deployment cannot run several gateway processes (the reason says why)."""


def check(workers: int, backend: str, capture_enabled: bool) -> None:
    """Raise `WorkersRefused` when `workers` > 1 cannot be served correctly."""
    if workers <= 1:
        return
    if capture_enabled:
        raise WorkersRefused(
            "gateway workers need capture off (AGENTRL_CAPTURE_ENABLED=false): an episode is "
            "assembled in one process, and its turns would reach several"
        )
    if backend == "vllm":
        raise WorkersRefused(
            "gateway workers serve upstream or local backends: with vLLM each worker would "
            "start its own vLLM server"
        )


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port with SO_REUSEPORT (every gateway process binds one;
    the kernel balances new connections over them). OSError when it cannot bind."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


# ---- the canary's evidence across processes ------------------------------------------------


def counters(state: GatewayState) -> dict[str, list[int]]:
    """A process's split-routed counters per version: [requests, errors, timeouts, tokens]."""
    return {
        m: [s.requests, s.errors, s.timeouts, s.completion_tokens] for m, s in state.stats.items()
    }


def stats_message(worker: str, state: GatewayState) -> bytes:
    return orjson.dumps({"worker": worker, "versions": counters(state)})


class FleetStats(Mapping[str, VersionStats]):
    """Per-version counters of every gateway process of this deployment, as the controller
    reads them (`stats.get(version).requests / .errors`): this process's own plus the latest
    cumulative counters each worker published. A worker that restarted is a new worker; the
    last counters of the old one stay, so the sum never goes back."""

    def __init__(self, local: dict[str, VersionStats]) -> None:
        self.local = local
        self.remote: dict[str, dict[str, list[int]]] = {}
        self.bad = 0  # messages that were not a worker's counters

    def absorb(self, data: bytes) -> None:
        try:
            doc = orjson.loads(data)
            versions = {
                str(m): [int(x) for x in v[:4]] + [0] * (4 - len(v[:4]))
                for m, v in doc["versions"].items()
            }
            self.remote[str(doc["worker"])] = versions
        except (ValueError, KeyError, TypeError, AttributeError):
            self.bad += 1

    def __getitem__(self, model_id: str) -> VersionStats:
        own = self.local.get(model_id)
        parts = [v[model_id] for v in self.remote.values() if model_id in v]
        if own is None and not parts:
            raise KeyError(model_id)
        total = VersionStats()
        if own is not None:
            total.requests, total.errors = own.requests, own.errors
            total.timeouts, total.completion_tokens = own.timeouts, own.completion_tokens
            total.latency_ms = own.latency_ms  # (this process's latencies only)
            total.first_error_at = own.first_error_at
        for r, e, t, tok in parts:
            total.requests += r
            total.errors += e
            total.timeouts += t
            total.completion_tokens += tok
        return total

    def __iter__(self) -> Iterator[str]:
        seen = dict.fromkeys(self.local)
        for v in self.remote.values():
            seen.update(dict.fromkeys(v))
        return iter(seen)

    def __len__(self) -> int:
        return sum(1 for _ in self)


async def collect_stats(bus: Any, subject: str, fleet: FleetStats, stop: asyncio.Event) -> None:
    """Fold the workers' counters into `fleet` until `stop` (core NATS: nothing stored)."""

    async def on_msg(msg: Any) -> None:
        fleet.absorb(msg.data)

    sub = await bus.nc.subscribe(subject, cb=on_msg)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def publish_stats(
    bus: Any,
    subject: str,
    worker: str,
    state: GatewayState,
    stop: asyncio.Event,
    every_s: float = STATS_EVERY_S,
) -> None:
    """Publish this worker's cumulative counters every `every_s`, and once more at the end."""
    while True:
        with contextlib.suppress(Exception):  # NATS away: the next one carries it all
            await bus.nc.publish(subject, stats_message(worker, state))
        if stop.is_set():
            with contextlib.suppress(Exception):
                await bus.nc.flush(timeout=2)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def new_subject() -> str:
    """The counters' subject of one deployment's workers (apart from other deployments')."""
    return f"{STATS_PREFIX}.{secrets.token_hex(6)}"


# ---- the worker processes ------------------------------------------------------------------


@dataclass
class WorkerPool:
    """Worker processes 1..count-1 of one gateway: started, restarted with backoff when one
    dies, stopped (SIGTERM, then SIGKILL) with the pool. `module` is the worker's entry."""

    count: int
    env: dict[str, str]
    logs: Path
    module: str = "agentrl.release.gateway_worker"
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    restarts: int = 0
    started: dict[int, float] = field(default_factory=dict)  # index -> time.monotonic()

    def start(self, i: int) -> None:
        from agentrl.core.deathsig import terminate_with_parent

        self.started[i] = time.monotonic()
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"gateway-worker-{i}.log", "ab") as fh:
            self.procs[i] = subprocess.Popen(
                [sys.executable, "-m", self.module],
                env={**self.env, WORKER_ENV: str(i)},
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=terminate_with_parent,  # a killed `agentrl up` leaves no worker behind
            )

    def status(self) -> dict[str, Any]:
        """How many workers run, and how often they were restarted (/v1/stats)."""
        alive = sum(1 for p in self.procs.values() if p.poll() is None)
        return {"count": self.count, "alive": 1 + alive, "restarts": self.restarts}

    def start_all(self) -> None:
        """Start the workers not started yet."""
        for i in range(1, self.count):
            if i not in self.procs:
                self.start(i)

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the workers running until `stop`, then stop them."""
        failures: dict[int, int] = {}
        due: dict[int, float] = {}
        try:
            self.start_all()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
                now = time.monotonic()
                for i, p in list(self.procs.items()):
                    code = p.poll()
                    if code is None or stop.is_set():
                        continue
                    if i not in due:
                        if now - self.started.get(i, now) > STEADY_S:  # had run for a while
                            failures[i] = 0
                        failures[i] = failures.get(i, 0) + 1
                        delay = BACKOFF_S[min(failures[i] - 1, len(BACKOFF_S) - 1)]
                        due[i] = now + delay
                        _process_gone(p.pid)
                        log.warning(
                            "gateway worker %d exited (%s): restarting in %.0f s", i, code, delay
                        )
                    elif now >= due[i]:
                        del due[i]
                        self.restarts += 1
                        self.start(i)
        finally:
            await asyncio.to_thread(self.stop)

    def stop(self, timeout: float = 10.0) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
            _process_gone(p.pid)


def _process_gone(pid: int) -> None:
    """A worker exited: its live gauges leave the merged `/metrics`."""
    from agentrl.observability.metrics import mark_process_dead

    mark_process_dead(pid)


def worker_env(settings: Any, nats_url: str, subject: str) -> dict[str, str]:
    """The environment of a worker: this process's, with where to serve and report."""
    env = dict(os.environ)
    env.update(
        {
            "NATS_URL": nats_url,
            "AGENTRL_NATS_URL": nats_url,
            "AGENTRL_DATA_DIR": str(Path(settings.data_dir).resolve()),
            "AGENTRL_GATEWAY_HOST": str(settings.gateway_host),
            "AGENTRL_GATEWAY_PORT": str(settings.gateway_port),
            STATS_ENV: subject,
        }
    )
    return env


def bus_url(bus: Any, settings: Any) -> str:
    """The NATS URL a worker connects to: the settings', else the server this bus is on."""
    if getattr(settings, "nats_url", None):
        return str(settings.nats_url)
    url = bus.nc.connected_url
    return f"{url.scheme}://{url.hostname}:{url.port}"
