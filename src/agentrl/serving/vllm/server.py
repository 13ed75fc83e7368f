"""Supervises one `vllm serve` process: start it (LoRA and runtime adapter loading on), wait
until it answers, run the on-ready hooks (reload adapters, warm up) before declaring it
ready, and restart it with backoff (1 s doubling to 60 s) whenever it exits or never comes
up. The port stays the same across restarts, so clients keep their URL.

A hook that fails makes the start a failure (the process is killed and started again): the
server is never `ready` with adapters missing.

vLLM runs with runtime LoRA updating on, so its `/v1/load_lora_adapter` would let any local
process load an adapter of its choice past the gateway (no checksum check, auth, capture or
split). Each server gets a random API key (`api_key`, 256 bits), which vLLM requires on
every `/v1` route and the backend sends. It goes in the environment (`VLLM_API_KEY`, which
vLLM reads as `--api-key`), not on the command line: /proc/<pid>/cmdline is readable by
every local user, /proc/<pid>/environ only by the owner.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from agentrl.core.deathsig import terminate_with_parent
from agentrl.serving.errors import BackendError
from agentrl.serving.vllm.lora import LoraLimits

log = logging.getLogger(__name__)

Hook = Callable[[], Awaitable[None]]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VllmServer:
    """`vllm serve` as a supervised child process (its own process group)."""

    def __init__(
        self,
        python: Path,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        served_name: str = "base",
        max_model_len: int = 2048,
        max_lora_rank: int = 16,
        max_loras: int = 4,
        max_cpu_loras: int | None = None,
        dtype: str = "float32",
        kv_cache_gib: float = 1.0,
        tool_call_parser: str | None = "pythonic",
        extra_args: list[str] | None = None,
        log_path: Path | None = None,
        startup_timeout_s: float = 900.0,
        restart_base_s: float = 1.0,
        restart_max_s: float = 60.0,
        api_key: str | None = None,
    ) -> None:
        self.python, self.model = Path(python), model
        # a new one per server; an operator's own `--api-key` (extra_args) wins in vLLM
        self.api_key = _flag(extra_args or [], "--api-key") or api_key or secrets.token_urlsafe(32)
        self.host, self.port = host, port or free_port(host)
        self.served_name = served_name
        self.args = [
            "--model", model,
            "--served-model-name", served_name,
            "--host", host,
            "--port", str(self.port),
            "--max-model-len", str(max_model_len),
            "--dtype", dtype,
            "--enable-lora",
            *(["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
              if tool_call_parser else []),
            *(extra_args or []),
        ]  # fmt: skip
        # sized from the adapters served (`vllm.lora`); `resize` restarts with new ones
        self.lora = LoraLimits(max_loras, max_lora_rank, max(max_loras, max_cpu_loras or 0))
        self.kv_cache_gib = kv_cache_gib
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.restart_base_s, self.restart_max_s = restart_base_s, restart_max_s
        self.on_ready: list[Hook] = []
        self.health_every_s, self.health_timeout_s, self.health_failures = 1.0, 10.0, 3
        self.state = "stopped"  # starting | ready | backoff | stopped
        self.last_error: str | None = None
        self.starts = 0  # processes started
        self.ready_count = 0  # times it became ready (1 + successful restarts)
        self.last_startup_s: float | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self._ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=40)

    @property
    def command_args(self) -> list[str]:
        """`vllm serve`'s arguments for the next start (the LoRA limits as now sized)."""
        return [*self.args, *self.lora.args()]

    async def resize(self, limits: LoraLimits) -> bool:
        """Start vLLM again with `limits` (its LoRA limits are fixed at start); the on-ready
        hooks reload every adapter before it counts as ready. False: nothing to change."""
        if limits == self.lora:
            return False
        log.warning("vLLM restarts to change its LoRA limits %s -> %s", self.lora, limits)
        self.lora = limits
        proc = self.proc
        if proc is not None and proc.returncode is None:
            self._ready.clear()
            self._set("starting")
            await self._kill(proc)  # the supervisor starts the next one with the new args
        return True

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        if self._task is None:
            self._set("starting")  # before the task runs: a waiter must not see "stopped"
            self._task = asyncio.create_task(self._supervise(), name="vllm-supervisor")

    async def wait_ready(self, timeout_s: float, through_restarts: bool = False) -> None:
        """Return once ready; BackendError(503) naming the last failure when it is not
        ready within `timeout_s` (or at once when it is backing off after a failure, unless
        `through_restarts`)."""
        deadline = time.monotonic() + timeout_s
        while not self._ready.is_set():
            left = deadline - time.monotonic()
            gave_up = self.state == "stopped" or (self.state == "backoff" and not through_restarts)
            if gave_up or left <= 0:
                why = f": {self.last_error}" if self.last_error else ""
                raise BackendError(f"vLLM is not ready ({self.state}){why}", 503)
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))

    def _set(self, state: str) -> None:
        self.state = state
        self._changed.set()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        env["VLLM_API_KEY"] = self.api_key  # every /v1 route, adapter loading included
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(self.kv_cache_gib))))
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        # vLLM closes idle keep-alive connections after 5 s; the gateway's pool reuses them
        # (measured in a loop run: 502s after each quiet spell while a job trained)
        env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "3600")
        env.pop("PYTHONPATH", None)  # agentrl's paths must not shadow vLLM's packages
        return env

    @property
    def pgid_path(self) -> Path | None:
        """Where the running server's process group is written (next to its log), so that
        the next supervisor can end a group this one left behind."""
        return self.log_path.with_suffix(".pgid") if self.log_path else None

    async def _supervise(self) -> None:
        if self.pgid_path is not None:
            # a supervisor that was SIGKILLed (OOM killer, kill -9 of `agentrl up`) cannot
            # end its vLLM: the engine core and worker went on (measured: a worker at 100 %
            # of a core and 2.8 GB, halving the next run's throughput)
            await asyncio.to_thread(reap_stale_group, self.pgid_path)
        failures = 0
        while not self._stop.is_set():
            ok = await self._run_once()
            if self._stop.is_set():
                break
            failures = 0 if ok else failures + 1
            delay = min(self.restart_max_s, self.restart_base_s * 2 ** max(0, failures - 1))
            log.error("vLLM stopped (%s); restarting in %.0f s", self.last_error, delay)
            self._set("backoff")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
        self._set("stopped")

    async def _run_once(self) -> bool:
        """One process's life; True when it became ready (a later exit is a crash)."""
        self._set("starting")
        started = time.monotonic()
        self.starts += 1
        logfile = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            self.proc = await asyncio.create_subprocess_exec(
                str(self.python),
                "-m",
                "vllm.entrypoints.openai.api_server",  # `vllm serve` (vllm-cpu's CLI
                *self.command_args,  # point fails: it looks up a distribution named "vllm")
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
                # the API server gets SIGTERM (and stops its engine) when the process that
                # started it dies, whatever killed it; a SIGKILLed supervisor's engine
                # processes are ended by the next one (reap_stale_group)
                preexec_fn=terminate_with_parent,
            )
        except OSError as exc:
            self.last_error = f"could not start {self.python}: {exc}"
            if logfile:
                logfile.close()
            return False
        if self.pgid_path is not None:
            # the group and its owner: a group whose owner still runs is not stale (two
            # supervisors must not share a data dir, but if they do, neither ends the other's)
            self.pgid_path.write_text(f"{self.proc.pid} {os.getpid()}")
        reader = asyncio.create_task(self._pump(self.proc, logfile))
        became_ready = False
        try:
            became_ready = await self._until_ready(self.proc, started)
            if became_ready:
                self.last_startup_s = time.monotonic() - started
                self.ready_count += 1
                self.last_error = None
                self._ready.set()
                self._set("ready")
                log.info("vLLM ready on %s in %.1f s", self.base_url, self.last_startup_s)
                await self._watch(self.proc)
        finally:
            self._ready.clear()
            await self._kill(self.proc)
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            if logfile:
                logfile.close()
        return became_ready

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        """Until stop, the server's exit, or /health failing `health_failures` times in a
        row. Not `proc.wait()`: vLLM's engine-core and worker processes outlive a killed API
        server and keep its stdout open, and asyncio's wait() waits for the pipe too."""
        failures = 0
        async with httpx.AsyncClient(timeout=self.health_timeout_s) as client:
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.health_every_s)
                if self._stop.is_set():
                    return
                if proc.returncode is not None:
                    self.last_error = f"vLLM exited with {proc.returncode}{self._why()}"
                    return
                try:
                    ok = (await client.get(f"http://{self.host}:{self.port}/health")).is_success
                except httpx.HTTPError:
                    ok = False
                failures = 0 if ok else failures + 1
                if failures >= self.health_failures:
                    self.last_error = f"vLLM stopped answering /health ({failures} checks)"
                    return

    async def _until_ready(self, proc: asyncio.subprocess.Process, started: float) -> bool:
        async with httpx.AsyncClient(timeout=5.0) as client:
            while time.monotonic() - started < self.startup_timeout_s:
                if self._stop.is_set():
                    return False
                if proc.returncode is not None:
                    self.last_error = f"vLLM exited with {proc.returncode} at start{self._why()}"
                    return False
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"http://{self.host}:{self.port}/health")).is_success:
                        break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 0.5)
            else:
                self.last_error = f"vLLM not up within {self.startup_timeout_s:.0f} s{self._why()}"
                return False
        try:
            for hook in self.on_ready:
                await hook()
        except Exception as exc:
            self.last_error = f"vLLM came up but getting it ready failed: {exc}"
            log.error("%s", self.last_error)
            return False
        return proc.returncode is None

    def _why(self) -> str:
        lines = [x for x in self._tail if "Error" in x or "error" in x]
        return f" ({lines[-1].strip()[:300]})" if lines else ""

    async def _pump(self, proc: asyncio.subprocess.Process, logfile: object) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            self._tail.append(raw.decode(errors="replace"))
            if logfile is not None:
                logfile.write(raw)  # type: ignore[attr-defined]
                logfile.flush()  # type: ignore[attr-defined]

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        """End the whole process group: the API server and its engine core and workers
        (they outlive a killed API server, holding memory and its stdout)."""
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _group_alive(proc.pid):
                await asyncio.sleep(0.1)
            if not _group_alive(proc.pid):
                break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5.0)  # reap the leader
        if self.pgid_path is not None and not _group_alive(proc.pid):
            self.pgid_path.unlink(missing_ok=True)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None


def _flag(args: list[str], name: str) -> str | None:
    """The value of `name` in `args` (`--name value` or `--name=value`), or None."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _alive(pid: int, group: bool = False) -> bool:
    """Whether process `pid` (or process group `pid`) exists: signal 0 delivers nothing."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    return _alive(pgid, group=True)


def group_members(pgid: int, proc_root: Path = Path("/proc")) -> dict[int, str]:
    """pid -> name (command line, else comm) of the live processes in process group
    `pgid`; empty where there is no /proc (not Linux)."""
    members: dict[int, str] = {}
    for d in proc_root.glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
            # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            members[int(d.name)] = cmd.strip() or stat[stat.index("(") + 1 : stat.rindex(")")]
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not readable
    return members


def reap_stale_group(pgid_path: Path, wait_s: float = 10.0) -> dict[int, str]:
    """End the process group a previous supervisor recorded in `pgid_path` ("pgid owner")
    if that supervisor is gone (or is this process) and the group still runs vLLM (a name
    with "vllm" in it: a recycled pgid of anything else is left alone). Returns the
    processes it ended."""
    try:
        pgid, *owner = (int(x) for x in pgid_path.read_text().split())
    except (OSError, ValueError):
        return {}
    if owner and owner[0] != os.getpid() and _alive(owner[0]):
        return {}  # its supervisor still runs: not stale
    members = group_members(pgid)
    if not members or not any("vllm" in name.lower() for name in members.values()):
        pgid_path.unlink(missing_ok=True)
        return {}
    log.warning(
        "ending vLLM processes left by an earlier supervisor (group %d): %s",
        pgid,
        ", ".join(f"{pid} {name[:60]}" for pid, name in sorted(members.items())),
    )
    for sig, wait in ((signal.SIGTERM, wait_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and group_members(pgid):
            time.sleep(0.1)
        if not group_members(pgid):
            break
    pgid_path.unlink(missing_ok=True)
    return members
