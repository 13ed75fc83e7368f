"""The kit of the stop tests (tests/app/test_stop_*.py, issue 54): a vLLM stand-in, and
starting a command, signalling it and looking for what it left running. Real processes
throughout. vLLM itself is a stand-in (the real one takes minutes to start and needs its own
environment, see tests/serving/test_vllm.py): a Python that answers vLLM's probe and serves
`/health`, `/v1/models` and `/v1/load_lora_adapter` from a process group with a child, as
vLLM's API server and engine core do."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil

NO_EXTRAS = ("--no-prefix", "--no-multilora")
AGENTRL = str(Path(sys.executable).parent / "agentrl")

STANDIN_SERVER = """
import http.server, json, os, subprocess, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
marker = os.environ["STANDIN_MARKER"]
# the engine core: a child in the same process group (start_new_session of the parent)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "vllm-engine-standin"])
class H(http.server.BaseHTTPRequestHandler):
    def _ok(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._ok({"object": "list", "data": [{"id": "base", "object": "model"}]})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._ok({})
    def log_message(self, *a):
        pass
with open(marker, "w") as fh:
    fh.write(f"{os.getpid()} {child.pid}")
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def standin_vllm(tmp: Path) -> Path:
    """A 'vLLM environment' whose python answers the import probe and runs the stand-in."""
    server = tmp / "standin_vllm.py"
    server.write_text(textwrap.dedent(STANDIN_SERVER))
    python = tmp / "vllm-env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-c" ]; then exit 0; fi\n'  # find_python's `import vllm` probe
        "shift 2\n"  # -m vllm.entrypoints.openai.api_server
        f'exec {sys.executable} {server} "$@"\n'
    )
    python.chmod(0o755)
    return python


def alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def left_running(kids: list[psutil.Process], grace: float) -> list[tuple[int, str]]:
    """The processes of `kids` still alive after up to `grace` seconds (a child being reaped
    after its parent's exit gets that long); each is SIGKILLed, so no test leaves one."""
    _, alive_ = psutil.wait_procs(kids, timeout=grace)
    left = [(k.pid, k.name()) for k in alive_ if alive(k.pid)]
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    return left


def wait_file(path: Path, proc: subprocess.Popen[str], timeout: float, log: Path) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"{path} not written in {timeout} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[str], sig: int, timeout: float = 60) -> float:
    t = time.monotonic()
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return time.monotonic() - t


def signal_when(
    cmd: list[str],
    env: dict[str, str],
    sig: int,
    ready: Callable[[list[str]], bool],
    log: Path,
    start_s: float = 120,
) -> tuple[float, list[tuple[int, str]]]:
    """Start `cmd`, send `sig` as soon as `ready` holds for its descendants' command lines,
    wait for its exit; (seconds to exit, the descendants still alive then). Every descendant
    seen while it ran counts, and none is left behind whatever happens."""
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, text=True, env=env)
    seen: dict[int, psutil.Process] = {}
    took = float("nan")
    try:
        deadline = time.monotonic() + start_s
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            lines = []
            with contextlib.suppress(psutil.NoSuchProcess):
                for k in psutil.Process(proc.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        lines.append(" ".join(k.cmdline()))
                        seen.setdefault(k.pid, k)
            if ready(lines):
                break
            assert time.monotonic() < deadline, f"not ready: {lines}\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
        took = stop(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
        time.sleep(0.3)
        left = []
        for pid, k in seen.items():
            with contextlib.suppress(psutil.Error):
                if alive(pid) and k.is_running():
                    left.append((pid, " ".join(k.cmdline())[:120]))
                    k.kill()
    return took, left


def fresh_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "AGENTRL_DATA_DIR": str(tmp / "data"), "COLUMNS": "200", **extra}
    for k in ("NATS_URL", "AGENTRL_NATS_URL"):
        env.pop(k, None)
    return env


def free_port_here() -> int:
    from agentrl.bus.server import free_port

    return free_port()
