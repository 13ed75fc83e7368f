"""The embedded stack behind `agentrl up`: nats-server, streams, and the services, supervised.

A service is `async def serve(bus, stop, settings) -> None` that runs until `stop` is set;
SERVICES names them by import path so this module needs none of them to import. Each runs
under a supervisor that restarts it with exponential backoff when it dies and keeps its health
(state, restarts, last error) where the status panel and `GET /health` can read it.

`agentrl up --replicas N` runs N of every service on this machine: this process is replica 0,
and N-1 child processes (`python -m agentrl.app.stack`, restarted with backoff when they die) run
the same services against the same NATS and data dir, each with `AGENTRL_REPLICA_ID=replica-i`
and its own ports (control API and gateway at the base port + i). Each replica is what one
host would run: see docs/guide/replicas.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from agentrl.bus.client import Bus
from agentrl.bus.server import EmbeddedNats
from agentrl.core.plugins import optional_module
from agentrl.core.settings import Settings, get_settings
from agentrl.serving import gctune

log = logging.getLogger(__name__)

SERVICES: tuple[tuple[str, str], ...] = (
    ("reward service", "agentrl.rewards.service:serve"),
    ("warehouse ingester", "agentrl.warehouse.service:serve"),
    ("training service", "agentrl.training.service:serve"),
    ("deployment controller", "agentrl.release.service:serve"),
    ("control API", "agentrl.app.api:serve"),
)

Serve = Callable[[Bus, asyncio.Event, Settings], Coroutine[Any, Any, None]]

# Started at once: the deployment controller (it loads the model: the longest start-up, and
# the gateway's first token is what a user waits for) and the control API (`/health`). The
# other services start once the gateway serves, or after GATEWAY_FIRST_S: on 2 cores their
# imports and start-up (pandas and chdb for the warehouse, the reward and training stores)
# took the CPU the model's load needed (py-spy of `agentrl bench startup`). Nothing waits on
# them meanwhile: what is published to their streams is consumed when they start.
FIRST = frozenset({"deployment controller", "control API"})
GATEWAY_FIRST_S = 120.0
AFTER_GATEWAY = "the gateway to serve first"

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
THREADS = 64  # the stack process's thread pool (see stack_services)


def load_services(
    only: set[str] | None = None, lazy: frozenset[str] = frozenset()
) -> list[tuple[str, Serve]]:
    """The installed services (a package missing from a partial install is skipped). Those in
    `lazy` are imported when they start, not now (their imports are start-up time)."""
    found: list[tuple[str, Serve]] = []
    for label, path in SERVICES:
        if only is not None and label not in only:
            continue
        module_name, attr = path.split(":")
        if label in lazy:
            if _installed(module_name):
                found.append((label, _imported_on_start(module_name, attr)))
            continue
        module = optional_module(module_name)
        if module is not None:
            found.append((label, getattr(module, attr)))
    return found


def _installed(module_name: str) -> bool:
    import importlib.util

    if module_name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:  # a package above it is missing
        return False


def _imported_on_start(module_name: str, attr: str) -> Serve:
    async def serve(bus: Bus, stop: asyncio.Event, settings: Settings) -> None:
        module = optional_module(module_name)
        if module is None:
            raise RuntimeError(f"{module_name} is not installed")
        await getattr(module, attr)(bus, stop, settings)

    return serve


async def _gateway_first(
    health: dict[str, ServiceHealth], stop: asyncio.Event, limit_s: float
) -> None:
    """Returns once the deployment controller serves (its probe answered), failed or is
    restarting, after `limit_s`, or when the stack stops."""
    deadline = time.monotonic() + limit_s
    first = health.get("deployment controller")
    while first is not None and not stop.is_set() and time.monotonic() < deadline:
        if first.state != "starting":
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def _after(gate: asyncio.Future[None], work: Coroutine[Any, Any, None]) -> None:
    try:
        await asyncio.shield(gate)
    except BaseException:
        work.close()
        raise
    await work


@dataclass
class ServiceHealth:
    """What the supervisor knows of one service; `state` is starting, running, restarting,
    failed (gave up) or stopped. A service with a readiness probe stays "starting" (with
    `waiting_for` naming what) until the probe answers: `running` means it serves."""

    name: str
    state: str = "starting"
    restarts: int = 0
    last_error: str | None = None
    since: float = field(default_factory=time.time)
    waiting_for: str | None = None
    ready_after_s: float | None = None

    @property
    def healthy(self) -> bool:
        return self.state == "running"


@dataclass(frozen=True)
class Probe:
    """What a service must answer before it counts as running: an HTTP server on
    `host:port` (a wildcard bind is probed on loopback)."""

    what: str
    host: str
    port: int


def readiness_probes(settings: Settings) -> dict[str, Probe]:
    """The services whose start-up takes long enough to lie about, by label: the deployment
    controller is ready when its gateway answers (it loads the model first: minutes on a
    cold cache, when "up" used to be printed). The control API is up when it answers, so an
    answer from its `/health` needs no probe."""
    host = settings.gateway_host
    near = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return {
        "deployment controller": Probe(
            f"the gateway on http://{host}:{settings.gateway_port}/v1",
            near,
            settings.gateway_port,
        ),
    }


async def answers_http(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether an HTTP server answers `GET /health` on host:port (any status line)."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(
                    f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
                )
                return (await reader.readline()).startswith(b"HTTP/")
            finally:
                writer.close()
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False


async def _until_ready(health: ServiceHealth, probe: Probe, period: float = 0.25) -> None:
    started = time.monotonic()
    while not await answers_http(probe.host, probe.port):
        await asyncio.sleep(period)
    health.state, health.since, health.waiting_for = "running", time.time(), None
    health.ready_after_s = round(time.monotonic() - started, 2)
    log.info("%s ready after %.1f s", health.name, health.ready_after_s)


async def supervise(
    name: str,
    serve: Serve,
    bus: Bus,
    stop: asyncio.Event,
    settings: Settings,
    health: ServiceHealth,
    backoff: tuple[float, ...] = BACKOFF_S,
    max_restarts: int | None = None,
    probe: Probe | None = None,
) -> None:
    """Run `serve` until `stop`; when it raises (or returns early) restart it after a backoff
    that grows per consecutive failure and resets once it has run for a minute. With a
    `probe` the service is "starting" until the probe answers, after every (re)start."""
    failures = 0
    while not stop.is_set():
        started = time.monotonic()
        ready: asyncio.Task[None] | None = None
        if probe is None:
            health.state, health.since, health.waiting_for = "running", time.time(), None
        else:
            health.state, health.since, health.waiting_for = "starting", time.time(), probe.what
            ready = asyncio.create_task(_until_ready(health, probe), name=f"{name} readiness")
        try:
            await serve(bus, stop, settings)
            if stop.is_set():
                break
            health.last_error = "returned before the stack stopped"
        except asyncio.CancelledError:
            raise
        except (Exception, SystemExit) as exc:  # a service's sys.exit is its failure, not ours
            health.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("%s died; restarting", name, extra={"service": name})
        finally:
            if ready is not None:
                ready.cancel()
        if time.monotonic() - started > 60:
            failures = 0
        failures += 1
        health.restarts += 1
        if max_restarts is not None and health.restarts > max_restarts:
            health.state = "failed"
            return
        health.state, health.since, health.waiting_for = "restarting", time.time(), None
        delay = backoff[min(failures - 1, len(backoff) - 1)]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
    health.state, health.since, health.waiting_for = "stopped", time.time(), None
    log.info("%s stopped", name, extra={"service": name})


@dataclass
class RunningStack:
    """A started stack: the bus, the stop event, every service's health and the URLs served."""

    bus: Bus
    stop: asyncio.Event
    settings: Settings
    nats_url: str
    health: dict[str, ServiceHealth]
    tasks: list[asyncio.Task[None]]

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://{self.settings.gateway_host}:{self.settings.gateway_port}/v1"

    def urls(self) -> dict[str, str]:
        return {
            "nats": self.nats_url,
            "control API": self.api_url,
            "OpenAPI": f"{self.api_url}/docs",
            "gateway (OpenAI /v1)": self.gateway_url,
            "metrics": f"{self.api_url}/metrics",
            "health": f"{self.api_url}/health",
        }

    def health_report(self) -> dict[str, Any]:
        return {name: asdict(h) | {"healthy": h.healthy} for name, h in self.health.items()}


@contextlib.asynccontextmanager
async def stack_services(
    nats_url: str,
    settings: Settings,
    only: set[str] | None = None,
    max_restarts: int | None = None,
    gateway_first_s: float | None = GATEWAY_FIRST_S,
) -> AsyncIterator[RunningStack]:
    """Connect to `nats_url`, create the streams and run the services under supervision until
    the block exits (then stop them and wait up to 15 s). With the deployment controller among
    them, the services outside FIRST start once the gateway serves (at most
    `gateway_first_s` later; None: all at once)."""
    # The services share this process's default thread pool (asyncio.to_thread): model
    # forward passes, validation episodes, checkpoint checks. Python's default of cpu + 4
    # workers (6 here) let one service's long calls queue every other service's short ones.
    # Work a caller can make long does not run here: structured-output compiles and
    # constraint building have bounded pools of their own (`agentrl.serving.structured`:
    # six distinct 15,000-property schemas once held this pool's threads and CPU while an
    # ordinary request waited 25-42 s).
    from concurrent.futures import ThreadPoolExecutor

    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="agentrl-stack")
    loop.set_default_executor(executor)
    probes = readiness_probes(settings)
    bus = await Bus.connect(nats_url, settings=settings, name="agentrl-up")
    await bus.ensure_streams()
    stop = asyncio.Event()
    health: dict[str, ServiceHealth] = {}
    tasks: list[asyncio.Task[None]] = []
    stack = RunningStack(bus, stop, settings, nats_url, health, tasks)
    selected = {label for label, _ in SERVICES if only is None or label in only}
    later = (
        frozenset(selected - FIRST)
        if gateway_first_s is not None and "deployment controller" in selected
        else frozenset()
    )
    services = load_services(only, lazy=later)
    gate: asyncio.Future[None] | None = None
    for label, serve in services:
        probe = probes.get(label)  # "starting, waiting for ..." before its task first runs
        waiting = probe.what if probe else (AFTER_GATEWAY if label in later else None)
        health[label] = ServiceHealth(label, waiting_for=waiting)
        work = supervise(
            label,
            serve,
            bus,
            stop,
            settings,
            health[label],
            max_restarts=max_restarts,
            probe=probe,
        )
        if label in later:
            if gate is None:
                assert gateway_first_s is not None
                gate = asyncio.ensure_future(_gateway_first(health, stop, gateway_first_s))
            work = _after(gate, work)
        tasks.append(asyncio.create_task(work, name=label))
    if gate is not None:
        tasks.append(gate)  # type: ignore[arg-type]
    _RUNNING[bus] = stack
    try:
        yield stack
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
        for task in tasks:
            task.cancel()
        _RUNNING.pop(bus, None)
        await bus.close()
        # A forward pass still running in a worker (a held-out evaluation, a validation
        # episode) has no one waiting for it now; asyncio.run would join it (`agentrl up`
        # lived ~30 s after "stopped cleanly"). Queued work is dropped, running work is left
        # to `exit_past_stragglers`; the loop gets a fresh pool (threads start on demand, so
        # an unused one has nothing to join; a loop that goes on, as in tests, keeps its
        # usual size).
        executor.shutdown(wait=False, cancel_futures=True)
        loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="asyncio"))


# The control API's `/health` finds the stack that runs it through the bus it was given.
_RUNNING: weakref.WeakKeyDictionary[Bus, RunningStack] = weakref.WeakKeyDictionary()


def running_stack(bus: Any) -> RunningStack | None:
    """The stack that owns `bus`, if it was started by `stack_services` in this process."""
    try:
        return _RUNNING.get(bus)
    except TypeError:
        return None


def replica_env(url: str, settings: Settings, i: int) -> dict[str, str]:
    """The environment of replica `i` (1..N-1): same NATS, data dir and settings, its own
    replica id and ports."""
    env = dict(os.environ)
    env.update(
        {
            "NATS_URL": url,
            "AGENTRL_NATS_URL": url,
            "AGENTRL_DATA_DIR": str(Path(settings.data_dir).resolve()),
            "AGENTRL_REPLICA_ID": f"replica-{i}",
            "AGENTRL_API_PORT": str(settings.api_port + i),
            "AGENTRL_GATEWAY_PORT": str(settings.gateway_port + i),
            "AGENTRL_STREAM_REPLICAS": str(settings.stream_replicas),
        }
    )
    return env


@dataclass
class Replica:
    """One child process running every service (replica `index`), restarted when it dies."""

    index: int
    env: dict[str, str]
    log_file: Path
    proc: subprocess.Popen[bytes] | None = None
    health: ServiceHealth = field(default_factory=lambda: ServiceHealth("replica"))

    def start(self) -> None:
        from agentrl.core.deathsig import terminate_with_parent

        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentrl.app.stack"],
                env=self.env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=terminate_with_parent,  # a killed `agentrl up` leaves no replica behind
            )
        self.health.state, self.health.since = "running", time.time()

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


async def run_replicas(
    url: str,
    settings: Settings,
    count: int,
    stop: asyncio.Event,
    health: dict[str, ServiceHealth],
) -> None:
    """Start replicas 1..count-1 and keep them running (restart with backoff) until `stop`."""
    logs = Path(settings.data_dir).resolve() / "logs"
    replicas = [
        Replica(i, replica_env(url, settings, i), logs / f"replica-{i}.log")
        for i in range(1, count)
    ]
    for r in replicas:
        r.health = ServiceHealth(f"replica {r.index}")
        health[r.health.name] = r.health
        r.start()
    failures = {r.index: 0 for r in replicas}
    try:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            for r in replicas:
                code = r.proc.poll() if r.proc is not None else None
                if code is None or stop.is_set():
                    continue
                failures[r.index] += 1
                r.health.restarts += 1
                r.health.last_error = f"exited with {code}; see {r.log_file}"
                r.health.state = "restarting"
                delay = BACKOFF_S[min(failures[r.index] - 1, len(BACKOFF_S) - 1)]
                log.warning("replica %d exited (%s): restarting in %.0f s", r.index, code, delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if not stop.is_set():
                    r.start()
    finally:
        await asyncio.gather(*(asyncio.to_thread(r.stop) for r in replicas))
        for r in replicas:
            r.health.state = "stopped"


async def serve_all(
    url: str, settings: Settings, services: bool, console: Console, replicas: int = 1
) -> None:
    from agentrl.app.status_panel import run_panel

    only: set[str] | None = None if services else set()
    async with stack_services(url, settings, only=only) as stack:
        if services and replicas > 1:
            stack.tasks.append(
                asyncio.create_task(
                    run_replicas(url, settings, replicas, stack.stop, stack.health),
                    name="replicas",
                )
            )
            for i in range(1, replicas):
                console.print(
                    f"  replica {i}: control API :{settings.api_port + i}, "
                    f"gateway :{settings.gateway_port + i}"
                )
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()

        def on_signal() -> None:
            if stack.stop.is_set():  # a second Ctrl-C: stop waiting for anything
                log.warning("second signal: cancelling what is left")
                if main is not None:
                    main.cancel()
                return
            log.info("signal received: stopping the services (again to force)")
            stack.stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        for name in stack.health:
            console.print(f"[green]started[/] {name}")
        for what, where in stack.urls().items():
            console.print(f"  {what:<22} {where}")
        took = await wait_ready(stack, console)
        if not stack.stop.is_set():
            console.print(f"[bold]agentrl is up[/] (serving after {took:.1f} s). Ctrl-C stops it.")
            await run_panel(stack, console)
        failed = [h for h in stack.health.values() if h.last_error]
        for h in failed:
            console.print(
                f"[yellow]{h.name}[/]: {h.restarts} restart(s), last error: {h.last_error}"
            )
    console.print("stopped cleanly")


class _LastLine(logging.Handler):
    """Keeps the newest INFO+ message of agentrl's loggers: what start-up is doing now."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.line = record.getMessage()[:160]


async def wait_ready(stack: RunningStack, console: Console, every_s: float = 5.0) -> float:
    """Wait until every service with a probe serves (or the stack stops), saying what it
    waits for and, every `every_s`, for how long and what start-up last logged. Returns the
    seconds waited."""
    started = time.monotonic()
    last = _LastLine()
    root = logging.getLogger("agentrl")
    root.addHandler(last)
    said: set[str] = set()
    next_note = started + every_s
    try:
        while not stack.stop.is_set():
            waiting = {
                h.name: h.waiting_for
                for h in stack.health.values()
                if h.state in ("starting", "restarting") and h.waiting_for
            }
            if not waiting:
                break
            for name, what in waiting.items():
                if name not in said:
                    said.add(name)
                    console.print(f"waiting for {what} ({name})")
            now = time.monotonic()
            if now >= next_note:
                next_note = now + every_s
                whats = ", ".join(sorted({w for w in waiting.values() if w}))
                note = f" - last: {last.line}" if last.line else ""
                console.print(f"  still waiting for {whats}: {now - started:.0f} s{note}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stack.stop.wait(), 0.25)
    finally:
        root.removeHandler(last)
    return time.monotonic() - started


def exit_past_stragglers(code: int = 0, grace_s: float = 2.0) -> None:
    """End the process now if worker threads still run after everything was stopped: a
    forward pass nobody waits for must not hold `agentrl up` for half a minute (the
    interpreter joins every pool thread at exit). Logs which threads, flushes, `os._exit`."""
    import threading

    structured = sys.modules.get("agentrl.serving.structured")  # pools only if it was used
    if structured is not None:
        structured.shutdown_pools()  # their idle threads held every exit for the grace
    deadline = time.monotonic() + grace_s
    for t in threading.enumerate():
        if t is threading.main_thread() or t.daemon:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
    left = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if not left:
        return
    log.warning(
        "exiting without waiting for %d worker thread(s): %s", len(left), ", ".join(left[:8])
    )
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _run(url: str, settings: Settings, services: bool, console: Console, replicas: int = 1) -> None:
    try:
        gctune.run(serve_all(url, settings, services, console, replicas))  # uvloop if there
    except (asyncio.CancelledError, KeyboardInterrupt):
        console.print("[yellow]stopped (forced by a second signal)[/]")
        raise SystemExit(130) from None
    log.info("event loop closed")


def preflight(settings: Settings) -> None:
    """Refuse to start an API beyond loopback with no token (`OpenBindRefused`), before
    anything starts, rather than each service failing on its own."""
    from agentrl.core.apiauth import check_exposure

    check_exposure(
        settings.api_host, bool(settings.api_tokens), "the control API", settings.allow_open
    )
    config = optional_module("agentrl.serving.config")
    if config is not None:
        keys = config.DeploySettings().api_keys
        check_exposure(settings.gateway_host, bool(keys), "the gateway", settings.allow_open)


def run_stack(
    data_dir: str | None = None, port: int | None = None, services: bool = True, replicas: int = 1
) -> None:
    from agentrl.core.apiauth import OpenBindRefused

    settings = get_settings()
    if data_dir:
        settings = settings.model_copy(update={"data_dir": Path(data_dir)})
    console = Console()
    try:
        preflight(settings)
    except OpenBindRefused as exc:
        console.print(f"[red]agentrl up: {exc}[/]")
        raise SystemExit(2) from None
    try:
        if settings.nats_url:
            console.print(f"using NATS at [bold]{settings.nats_url}[/] (NATS_URL)")
            _run(settings.nats_url, settings, services, console, replicas)
        else:
            with EmbeddedNats(settings=settings, port=port) as server:
                console.print(
                    f"nats-server with JetStream listening on [bold]{server.url}[/]\n"
                    f"  store: {server.store_dir}\n  log:   {server.log_file}\n"
                    f"  export NATS_URL={server.url}  # for other shells"
                )
                _run(server.url, settings, services, console, replicas)
            log.info("nats-server stopped")
    except SystemExit as exc:
        exit_past_stragglers(exc.code if isinstance(exc.code, int) else 1)
        raise
    exit_past_stragglers(0)


async def _replica_main() -> None:
    """One replica (a child of `agentrl up --replicas N`): every service, no panel, until
    SIGTERM."""
    settings = get_settings()
    url = settings.nats_url or ""
    async with stack_services(url, settings) as stack:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stack.stop.set)
        log.info("replica %s up against %s", os.environ.get("AGENTRL_REPLICA_ID"), url)
        await stack.stop.wait()


if __name__ == "__main__":
    from agentrl.core.gcstart import raise_young_generation
    from agentrl.core.logs import setup_logging

    raise_young_generation()  # before the services' imports
    setup_logging()
    gctune.run(_replica_main())
    exit_past_stragglers(0)
