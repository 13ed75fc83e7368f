"""The code_exe sandbox: the escapes that worked against the old "socket-patch" mode, each
tried for real against every isolation tool this machine has (bwrap, unshare), with a host
control that shows the same snippet succeeds outside the sandbox (so each test can fail)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.envs.tooluse import run_python
from agentrl.envs.tooluse.sandbox import (
    SandboxSettings,
    SandboxUnavailableError,
    _probe,
    isolation_tool,
)

INSTALL = {
    "bwrap": "bubblewrap is missing or cannot create namespaces here: `apt-get install bubblewrap`",
    "unshare": "util-linux `unshare` cannot create mount+network namespaces here (needs root or "
    "unprivileged user namespaces)",
}


@pytest.fixture(params=["bwrap", "unshare"])
def tool(request: pytest.FixtureRequest) -> SandboxSettings:
    if not _probe(request.param):
        pytest.skip(INSTALL[request.param])
    return SandboxSettings(tool=request.param)


@pytest.fixture(scope="module")
def tcp_server() -> Iterator[int]:
    """A real TCP server on the host's loopback that answers b"pong"."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.sendall(b"pong")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1]
    stop.set()
    thread.join()
    srv.close()


def on_host(code: str) -> str:
    """The control: the same snippet run as a plain child process, without the sandbox."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, check=False
    )
    return out.stdout


# `_socket` is the C module under `socket`: the old preamble patched only `socket.socket`.
RAW_SOCKET = """
import _socket
try:
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(("127.0.0.1", {port}))
    print("CONNECTED", s.recv(4))
except OSError as exc:
    print("BLOCKED", exc)
"""

HIGH_LEVEL = """
import socket
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("CONNECTED", s.recv(4))
except OSError as exc:
    print("BLOCKED", exc)
"""


def test_sandbox_runs_code(tool: SandboxSettings) -> None:
    result = run_python("import math\nprint(sum(range(10)), math.factorial(5))", settings=tool)
    assert result.ok and result.stdout.strip() == "45 120" and result.isolation == tool.tool
    bad = run_python("raise SystemExit(3)", settings=tool)
    assert bad.returncode == 3 and not bad.ok
    err = run_python("1/0", settings=tool)
    assert "ZeroDivisionError" in err.stderr
    # the working directory is a private, writable tmpfs
    scratch = run_python(
        "open('x.txt', 'w').write('hi')\nprint(open('x.txt').read())", settings=tool
    )
    assert scratch.ok and scratch.stdout.strip() == "hi"


@pytest.mark.parametrize("snippet", [RAW_SOCKET, HIGH_LEVEL], ids=["_socket", "socket"])
def test_sandbox_cannot_reach_a_host_server(
    tool: SandboxSettings, tcp_server: int, snippet: str
) -> None:
    code = snippet.format(port=tcp_server)
    assert "CONNECTED b'pong'" in on_host(code)  # the control: it works without the sandbox
    result = run_python(code, settings=tool)
    assert "BLOCKED" in result.stdout and "CONNECTED" not in result.stdout, result


def test_sandbox_cannot_read_host_files(tool: SandboxSettings, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    repo_file = Path(__file__).resolve()  # outside every read-only bind
    code = (
        f"for p in ({str(secret)!r}, {str(repo_file)!r}, '/etc/passwd'):\n"
        "    try:\n"
        "        print('READ', p, len(open(p).read()))\n"
        "    except OSError as exc:\n"
        "        print('DENIED', p, type(exc).__name__)\n"
    )
    assert on_host(code).count("READ") == 3
    result = run_python(code, settings=tool)
    assert result.ok and result.stdout.count("DENIED") == 3 and "READ" not in result.stdout


def test_sandbox_cannot_write_outside(tool: SandboxSettings, tmp_path: Path) -> None:
    targets = [tmp_path / "escape.txt", Path(sys.prefix) / "agentrl-escape.txt"]
    code = (
        f"for p in {[str(t) for t in targets]!r}:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('WROTE', p)\n"
        "    except OSError as exc:\n"
        "        print('DENIED', p, type(exc).__name__)\n"
    )
    try:
        result = run_python(code, settings=tool)
        assert result.stdout.count("DENIED") == 2, result
        assert not any(t.exists() for t in targets)
    finally:
        for t in targets:
            t.unlink(missing_ok=True)


def test_sandbox_fork_bomb_is_bounded(tool: SandboxSettings) -> None:
    code = (
        "import os, time\n"
        "n = 0\n"
        "while n < 10000:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        print('FORK FAILED AFTER', n, flush=True)\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
    )
    settings = tool.model_copy(update={"max_processes": 32})
    started = time.perf_counter()
    result = run_python(code, settings=settings, timeout_s=3)
    assert "FORK FAILED AFTER" in result.stdout, result
    forked = int(result.stdout.split("FORK FAILED AFTER")[1].split()[0])
    assert forked < 32
    assert time.perf_counter() - started < 10  # the sleeping children did not hold it open


def test_sandbox_limits_cannot_be_raised_back(tool: SandboxSettings) -> None:
    code = (
        "import os, resource as r\n"
        "print('uid', os.getuid())\n"
        "soft, hard = r.getrlimit(r.RLIMIT_AS)\n"
        "try:\n"
        "    r.setrlimit(r.RLIMIT_AS, (hard * 2, hard * 2))\n"
        "    print('RAISED')\n"
        "except (ValueError, OSError):\n"
        "    print('KEPT')\n"
    )
    result = run_python(code, settings=tool)
    assert "KEPT" in result.stdout and "uid 0" not in result.stdout, result


def test_sandbox_timeout_kills_the_process(tool: SandboxSettings) -> None:
    started = time.perf_counter()
    result = run_python("while True:\n    pass", timeout_s=0.5, settings=tool)
    assert result.timed_out and result.returncode is None
    assert time.perf_counter() - started < 5


def test_sandbox_memory_limit(tool: SandboxSettings) -> None:
    code = "x = bytearray(1024 * 1024 * 1024)\nprint('allocated')"
    result = run_python(code, memory_mb=256, settings=tool)
    assert not result.ok and "allocated" not in result.stdout
    assert "MemoryError" in result.stderr


def test_refuses_without_an_isolation_tool(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, no unshare on this PATH
    with pytest.raises(SandboxUnavailableError, match="AGENTRL_SANDBOX_ALLOW_UNISOLATED=1"):
        run_python("print('ran')")
    with pytest.raises(SandboxUnavailableError):
        isolation_tool(SandboxSettings(tool="bwrap"))
    # the loud opt-in: it runs, and says so on every run
    monkeypatch.setenv("AGENTRL_SANDBOX_ALLOW_UNISOLATED", "1")
    with caplog.at_level(logging.WARNING, logger="agentrl.envs.tooluse.sandbox"):
        result = run_python("print('ran')")
    assert result.ok and result.isolation == "none" and result.stdout.strip() == "ran"
    assert any("WITHOUT ISOLATION" in r.getMessage() for r in caplog.records)
    assert os.environ["PATH"] == str(tmp_path)
