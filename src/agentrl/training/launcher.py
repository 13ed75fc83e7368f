"""A job launcher: one process that imported torch and transformers once forks every job.

A job process spends its first 5-8 CPU-seconds importing torch, transformers and peft before
it reads a byte of data. A launcher (`python -m agentrl.training.worker --launcher SOCKET`)
pays that once: it imports them, listens on a Unix socket, and forks a child per order. The
child is that job's process exactly as a freshly started one would be: its own session,
the runner's environment and working directory, its `process.log`, SIGTERM to cancel.

A job dies with the runner that ordered it, as PR_SET_PDEATHSIG makes a child process die:
the runner keeps the order's connection open while the job runs, and when that connection
closes (the runner exited or was SIGKILLed) the launcher SIGKILLs the job. A job dies with
its launcher too (its own PR_SET_PDEATHSIG): nobody would report its exit.

The launcher is one thread around a selector: forking a process that runs other threads can
leave their locks held in the child. Torch's thread pools start on first use, not at import,
so the children start with none.

Protocol, one connection per job: the runner sends one JSON line `{"job_dir", "env", "cwd"}`;
the launcher answers `{"pid": N}` once the child runs, then `{"returncode": R}` when it
exits (negative: killed by signal -R, as asyncio reports a child's exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import json
import logging
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from agentrl.core.deathsig import die_with_parent

log = logging.getLogger("agentrl.training.launcher")

LAUNCHER_FLAG = "--launcher"

# what every job imports: the launcher imports it once
PRELOAD = (
    "torch",
    "transformers",
    "peft",
    "agentrl.llm.loading",
    "agentrl.llm.checkpoint",
    "agentrl.llm.trainer",
    "agentrl.training.jobs",
    "agentrl.training.samples",
    "agentrl.training.choice_job",
    "agentrl.training.plot",  # pyplot, for the job's curves
    # a job's own modules that torch's do not bring (0.11 CPU-s a job, nats' above all)
    "agentrl.bus",
    "agentrl.training.requests",
    "agentrl.training.settings",
    "agentrl.learners.valid_action",
)


# ---- the runner's side -------------------------------------------------------------------


class LaunchedJob:
    """A job process forked by a launcher, with what the service uses of
    `asyncio.subprocess.Process`: `pid`, `returncode`, `wait()`, `send_signal()`, `kill()`."""

    def __init__(self, pid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.pid = pid
        self.returncode: int | None = None
        self._writer = writer
        self._done = asyncio.Event()
        self._watch = asyncio.get_running_loop().create_task(self._wait_exit(reader))

    async def _wait_exit(self, reader: asyncio.StreamReader) -> None:
        code = -signal.SIGKILL  # the launcher died: so did the job (its PR_SET_PDEATHSIG)
        with contextlib.suppress(Exception):
            line = await reader.readline()
            if line:
                code = int(json.loads(line)["returncode"])
        self.returncode = code
        self._writer.close()
        self._done.set()

    async def wait(self) -> int:
        await self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def launch(
    path: str | Path, job_dir: Path, env: dict[str, str], timeout_s: float = 120.0
) -> LaunchedJob:
    """Order the job in `job_dir` from the launcher at `path`; the job's process once it
    runs. Raises OSError when the launcher cannot be reached or does not answer in
    `timeout_s` (it answers once its imports are done: a launcher just started takes as long
    as a fresh job process would)."""
    order = {"job_dir": str(job_dir), "env": env, "cwd": os.getcwd()}
    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 5.0)
    try:
        writer.write(json.dumps(order).encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout_s)
        if not line:
            raise ConnectionResetError("the launcher closed the connection")
        answer = json.loads(line)
        if "pid" not in answer:
            raise OSError(f"the launcher refused the job: {answer.get('error', answer)}")
        return LaunchedJob(int(answer["pid"]), reader, writer)
    except BaseException:
        writer.close()
        raise


class OwnLauncher:
    """A launcher a service starts for itself (`warm_worker`): started at once, so its
    imports are done when the first job comes; started again when it died."""

    def __init__(
        self,
        path: Path,
        log_path: Path,
        env: dict[str, str],
        preexec_fn: Callable[[], None] | None,
    ) -> None:
        self.path = path
        self.log_path = log_path
        self.env = env
        self.preexec_fn = preexec_fn
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Start the launcher unless it runs (a failure to start is logged: jobs then start
        processes of their own)."""
        if self.alive:
            return
        if self.proc is not None:
            log.warning(
                "the job launcher exited (%s, see %s): starting it again",
                self.proc.returncode,
                self.log_path,
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        try:
            with open(self.log_path, "ab") as fh:
                self.proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "agentrl.training.worker",
                    LAUNCHER_FLAG,
                    str(self.path),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=fh,
                    stderr=fh,
                    env=self.env,
                    start_new_session=True,
                    preexec_fn=self.preexec_fn,
                )
        except OSError as exc:
            log.warning("cannot start a job launcher: %s", exc)
            self.proc = None
            return
        # it binds its socket before its imports: wait for the socket, not the imports
        for _ in range(200):
            if self.path.exists() or not self.alive:
                return
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


# ---- the launcher's side (`python -m agentrl.training.worker --launcher SOCKET`) ----------


def serve(path: Path, run_job: Callable[[Path], int], preload: tuple[str, ...] = PRELOAD) -> int:
    """Bind `path`, import `preload`, then fork `run_job(job_dir)` for each order until
    SIGTERM or SIGINT; live jobs are killed on the way out (nobody would report their
    exit)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)  # orders wait in the backlog while the imports run
    _preload(preload)
    if preload:  # (a launcher that preloads nothing warms nothing: tests' stand-ins)
        warm_up()
    launcher = _Launcher(server, run_job)
    print(f"launcher: pid {os.getpid()} ready on {path}", flush=True)
    launcher.run()
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return 0


class _Launcher:
    """The selector loop: accept connections, read each one's order, fork its job, report
    its exit, kill it when its runner's connection closes."""

    def __init__(self, server: socket.socket, run_job: Callable[[Path], int]) -> None:
        self.server, self.run_job = server, run_job
        server.setblocking(False)
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.stopping: list[int] = []
        signal.set_wakeup_fd(self.wake_w.fileno())  # SIGCHLD wakes the selector
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda sig, _f: self.stopping.append(sig))
        signal.signal(signal.SIGINT, lambda sig, _f: self.stopping.append(sig))
        self.pid = os.getpid()
        self.sel = selectors.DefaultSelector()
        self.sel.register(server, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.orders: dict[socket.socket, bytearray] = {}  # connections whose order is coming
        self.jobs: dict[int, socket.socket | None] = {}  # pid -> its runner's connection

    def run(self) -> None:
        while not self.stopping:
            for key, _ in self.sel.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        while self.wake_r.recv(4096):
                            pass
                else:
                    assert isinstance(key.fileobj, socket.socket)
                    self._read(key.fileobj)
            self._reap()
        for pid in list(self.jobs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            conn, _addr = self.server.accept()
            conn.setblocking(False)
            self.orders[conn] = bytearray()
            self.sel.register(conn, selectors.EVENT_READ, "conn")

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if conn not in self.orders:  # a running job's runner: only its going away matters
            if not data:
                self._runner_gone(conn)
            return
        if not data:
            del self.orders[conn]
            self._forget(conn)
            return
        self.orders[conn] += data
        if b"\n" in self.orders[conn]:
            self._start(conn, bytes(self.orders.pop(conn)).split(b"\n", 1)[0])

    def _start(self, conn: socket.socket, raw: bytes) -> None:
        try:
            order = json.loads(raw)
            job_dir = Path(order["job_dir"])
        except (ValueError, KeyError, TypeError) as exc:
            self._send(conn, {"error": f"bad order: {exc}"})
            self._forget(conn)
            return
        runners = [c for c in self.jobs.values() if c is not None]
        mine = [conn, self.server, self.wake_r, self.wake_w, *self.orders, *runners]
        inherited = [c.fileno() for c in mine]
        if isinstance(self.sel, selectors.EpollSelector):
            inherited.append(self.sel.fileno())
        # signals wait until the child has its own handlers: a cancel (SIGTERM) sent at once
        # must not reach the launcher's handler in the child
        signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        pid = os.fork()
        if pid == 0:
            self._child(order, job_dir, inherited)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
        self.jobs[pid] = conn
        self._send(conn, {"pid": pid})

    def _child(self, order: dict[str, Any], job_dir: Path, inherited: list[int]) -> None:
        """The job's process: never returns into the launcher's loop."""
        code = 1
        try:
            _become_job(order, inherited, self.pid)
            code = self.run_job(job_dir)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            exit_forked(code)

    def _reap(self) -> None:
        while self.jobs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.jobs.pop(pid, None)
            if conn is not None:
                self._send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                self._forget(conn)

    def _runner_gone(self, conn: socket.socket) -> None:
        """The runner that ordered a job exited or was killed: so is its job."""
        for pid, owner in self.jobs.items():
            if owner is conn:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.jobs[pid] = None
        self._forget(conn)

    def _send(self, conn: socket.socket, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.setblocking(True)
            conn.sendall(json.dumps(message).encode() + b"\n")
            conn.setblocking(False)

    def _forget(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)
        conn.close()


_HANDLED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT)


def exit_forked(code: int) -> NoReturn:
    """End a forked child (a job, or the loop's launcher) without running its parent's
    exit handlers, once what it printed is written."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _die_with_launcher(launcher_pid: int) -> None:
    """PR_SET_PDEATHSIG in the child; a launcher that died before it took effect is seen
    as a new parent."""
    die_with_parent()
    if os.getppid() != launcher_pid:
        os._exit(1)


def _preload(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the job itself reports a broken import
            print(f"launcher: cannot preload {name}: {exc}", file=sys.stderr, flush=True)


def warm_up() -> None:
    """Build what each job built again on its first model load or peft wrap and then kept
    for its life, so that every fork inherits it: transformers' table of checkpoint weight
    conversions (~1,100 converters, each compiling its regexes: 0.16 CPU-s a job) and
    SmolLM2's tokenizer when it is converted (~0.3 CPU-s a job). Then
    collect once and freeze what is left (the imports' ~400,000 objects): no later full
    collection, the launcher's or a forked job's, walks them again, and a job's collections
    do not write to the pages it shares with the launcher. Starts no thread (the children
    are forked)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        get_checkpoint_conversion_mapping("llama")
    except Exception as exc:  # another transformers: each job builds its own, as before
        print(f"launcher: no conversion table built: {exc}", file=sys.stderr, flush=True)
    try:  # SmolLM2's tokenizer, which every job reads (the tiny model's too)
        from agentrl.llm.loading import preload_smollm2_tokenizer

        preload_smollm2_tokenizer()
    except Exception as exc:  # each job reads its own, as before
        print(f"launcher: no tokenizer read: {exc}", file=sys.stderr, flush=True)
    gc.collect()
    gc.freeze()


def _become_job(order: dict[str, Any], inherited: list[int], launcher_pid: int) -> None:
    """In the forked child: dies with the launcher; the job's own session, environment,
    directory and log; none of the launcher's sockets or signal handlers."""
    _die_with_launcher(launcher_pid)
    signal.set_wakeup_fd(-1)
    for sig in _HANDLED:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)  # a SIGTERM sent meanwhile acts now
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)
    os.setsid()
    env = order.get("env") or {}
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})
    with contextlib.suppress(OSError):
        os.chdir(order.get("cwd") or "/")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    # OpenMP read the launcher's at its load. A launcher that did not preload torch (a
    # stand-in's) leaves it to the job's own import, which reads the job's env: importing it
    # here only to set threads cost each such job ~2.3 CPU-s.
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    job_dir = Path(order["job_dir"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    fd = os.open(job_dir / "process.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
