"""`code_exe`: run an untrusted Python snippet inside a real isolation tool.

Isolation, in order of preference (the mode used is reported in `SandboxResult.isolation`):
  - "bwrap" (Debian's bubblewrap): a fresh, empty root filesystem in a private mount
    namespace holding only read-only binds of what Python needs (/usr, the interpreter's
    prefix, the virtualenv), a read-only /sandbox/main.py, and size-capped tmpfs for /work
    (the working directory) and /tmp; new network (no interfaces but a downed loopback),
    PID, IPC, UTS and cgroup namespaces; the child dies with its parent.
  - "unshare" (util-linux), where bwrap is missing: the same layout built by a small shell
    script in new mount/network/PID/IPC/UTS namespaces, then `chroot` into it.
  - "none": no isolation. Refused (`SandboxUnavailableError`) unless the user opts in
    loudly with `AGENTRL_SANDBOX_ALLOW_UNISOLATED=1`, which logs a warning on every run.
Always: the snippet runs as an unprivileged user (when agentrl runs as root, `setpriv`
drops to uid/gid 65534 inside the sandbox, so the limits below cannot be raised back and
RLIMIT_NPROC is enforced), `python -I`, a clean environment, RLIMIT_AS (memory), RLIMIT_CPU,
RLIMIT_NPROC (processes, bounds a fork bomb), RLIMIT_FSIZE (file size) set before the
snippet runs, its own session killed on timeout, and output truncated.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict

from agentrl.core.errors import AgentRLError

log = logging.getLogger(__name__)

Isolation = Literal["bwrap", "unshare", "none"]
NOBODY = 65534
_TMPFS_BYTES = 64 * 1024 * 1024
WORKDIR = "/sandbox/work"  # writable tmpfs, the snippet's cwd and HOME
SCRIPT = "/sandbox/code/main.py"  # the snippet, read-only
_SETPRIV = ("--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", "--no-new-privs")


class SandboxUnavailableError(AgentRLError):
    """No isolation tool works on this machine, and unisolated runs were not allowed."""


class SandboxSettings(BaseSettings):
    """`AGENTRL_SANDBOX_*`: which tool to use, and the loud opt-in for running unisolated."""

    model_config = SettingsConfigDict(env_prefix="AGENTRL_SANDBOX_", extra="ignore")

    tool: Literal["auto", "bwrap", "unshare"] = "auto"
    allow_unisolated: bool = False
    max_processes: int = 64
    max_file_bytes: int = 16 * 1024 * 1024


# Limits are set by the (already unprivileged) child before the snippet runs (no preexec_fn:
# forking with one is unsafe when the caller has threads, as the rollout worker does).
_LIMITS = """\
import os as _o, resource as _r
_o.chdir({workdir!r})
_r.setrlimit(_r.RLIMIT_AS, ({mem}, {mem}))
_r.setrlimit(_r.RLIMIT_CPU, ({cpu}, {cpu}))
_r.setrlimit(_r.RLIMIT_FSIZE, ({fsize}, {fsize}))
_r.setrlimit(_r.RLIMIT_NPROC, ({nproc}, {nproc}))
_r.setrlimit(_r.RLIMIT_CORE, (0, 0))
del _o, _r
"""

_RUNNER = """\
import runpy, sys
sys.argv = ["main.py"]
runpy.run_path({script!r}, run_name="__main__")
"""


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    isolation: Isolation
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _python_roots() -> list[str]:
    """Directories the interpreter needs, read-only: /usr, its prefix, the virtualenv."""
    roots = ["/usr"]
    for path in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(path)
        if not any(real == r or real.startswith(r + "/") for r in roots):
            roots.append(real)
    if sys.prefix != os.path.realpath(sys.prefix):
        roots.append(sys.prefix)
    return roots


def _top_level_links() -> list[tuple[str, str]]:
    """/bin, /lib, /lib64, /sbin: symlinks into /usr on merged-/usr systems (Debian)."""
    out = []
    for name in ("bin", "sbin", "lib", "lib64", "lib32"):
        path = "/" + name
        if os.path.islink(path):
            out.append((os.readlink(path), path))
    return out


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _bwrap_command(host_dir: str, as_root: bool) -> list[str]:
    bwrap = shutil.which("bwrap") or "bwrap"
    cmd = [bwrap, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    cmd += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    cmd += ["--unshare-cgroup-try"]
    if not as_root:
        cmd += ["--unshare-user"]
    # tmpfs first, so that a Python prefix below /tmp (a CI virtualenv) is bound on top of it
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    binds = [*_python_roots(), "/etc/ld.so.cache", "/etc/localtime", SCRIPT]
    # bwrap creates missing parents 0700 (root-only): make them 0755 for the unprivileged child
    for parent in sorted({p for b in binds for p in _parents(b)}):
        cmd += ["--perms", "0755", "--dir", parent]
    cmd += ["--perms", "01777", "--size", str(_TMPFS_BYTES), "--tmpfs", "/tmp"]
    cmd += ["--perms", "01777", "--size", str(_TMPFS_BYTES), "--tmpfs", WORKDIR]
    for root in _python_roots():
        cmd += ["--ro-bind", root, root]
    for target, link in _top_level_links():
        cmd += ["--symlink", target, link]
    for extra in ("/etc/ld.so.cache", "/etc/localtime"):
        if os.path.exists(extra):
            cmd += ["--ro-bind", extra, extra]
    cmd += ["--ro-bind", os.path.join(host_dir, "main.py"), SCRIPT]
    cmd += ["--chdir", WORKDIR, "--"]
    if as_root:
        cmd += [shutil.which("setpriv") or "/usr/bin/setpriv", *_SETPRIV]
    return cmd


def _unshare_command(host_dir: str, as_root: bool) -> list[str]:
    """The bwrap layout built by hand: tmpfs root, read-only binds, chroot, drop privileges."""
    root = os.path.join(host_dir, "root")
    lines = [
        "set -e",
        "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        f"R={shlex.quote(root)}",
        'mkdir -p "$R"',
        'mount -t tmpfs -o size=64m tmpfs "$R"',
    ]
    lines += ['mkdir -p "$R/proc" "$R/dev" "$R/tmp" "$R/sandbox/work" "$R/sandbox/code"']
    lines += ['mount -t proc proc "$R/proc"']
    for dev in ("null", "zero", "urandom", "random"):
        lines += [f'touch "$R/dev/{dev}"', f'mount --bind /dev/{dev} "$R/dev/{dev}"']
    lines += [f'mount -t tmpfs -o size={_TMPFS_BYTES},mode=1777 tmpfs "$R/tmp"']
    lines += [f'mount -t tmpfs -o size={_TMPFS_BYTES},mode=1777 tmpfs "$R{WORKDIR}"']
    for src in _python_roots():
        q = shlex.quote(src)
        lines += [f'mkdir -p "$R"{q}', f'mount --rbind {q} "$R"{q}']
        lines += [f'mount -o remount,bind,ro "$R"{q}']
    for target, link in _top_level_links():
        lines.append(f'ln -s {shlex.quote(target)} "$R"{shlex.quote(link)}')
    main = shlex.quote(os.path.join(host_dir, "main.py"))
    lines += [f'touch "$R{SCRIPT}"', f'mount --bind {main} "$R{SCRIPT}"']
    lines += [f'mount -o remount,bind,ro "$R{SCRIPT}"']
    drop = f"/usr/bin/setpriv {' '.join(_SETPRIV)} " if as_root else ""
    lines.append(f'exec chroot "$R" {drop}"$@"')
    unshare = shutil.which("unshare") or "unshare"
    flags = ["--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
    if not as_root:
        flags.insert(0, "--map-root-user")
    return [unshare, *flags, "--", "/bin/sh", "-c", "\n".join(lines), "sandbox"]


_BUILDERS = {"bwrap": _bwrap_command, "unshare": _unshare_command}


def _probe(tool: str) -> bool:
    """Whether `tool` can actually start Python here (containers often forbid namespaces)."""
    return _probe_at(tool, shutil.which(tool))


@functools.lru_cache(maxsize=8)
def _probe_at(tool: str, path: str | None) -> bool:
    if path is None:
        return False
    try:
        with tempfile.TemporaryDirectory(prefix="agentrl-probe-") as host_dir:
            _write_main(host_dir, "print('ok')")
            cmd = [*_command(tool, host_dir), sys.executable, "-I", SCRIPT]  # type: ignore[arg-type]
            probe = subprocess.run(cmd, capture_output=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    if probe.returncode != 0 or probe.stdout.strip() != b"ok":
        log.debug("sandbox tool %s unusable: %s", tool, probe.stderr.decode(errors="replace"))
        return False
    return True


def isolation_tool(settings: SandboxSettings | None = None) -> Isolation:
    """The isolation this machine supports; raises if none works and none was allowed."""
    settings = settings or SandboxSettings()
    tools = ["bwrap", "unshare"] if settings.tool == "auto" else [settings.tool]
    for tool in tools:
        if _probe(tool):
            return tool  # type: ignore[return-value]
    if settings.allow_unisolated:
        return "none"
    raise SandboxUnavailableError(
        f"no working isolation tool for untrusted code (tried {', '.join(tools)}). Install "
        "bubblewrap (`apt-get install bubblewrap`) or allow user namespaces; to run agent code "
        "WITHOUT isolation anyway (trusted code only) set AGENTRL_SANDBOX_ALLOW_UNISOLATED=1."
    )


def network_isolation() -> tuple[Isolation, tuple[str, ...]]:
    """Backward-compatible helper: the mode and its command prefix (no per-run paths)."""
    mode = isolation_tool()
    return mode, (() if mode == "none" else (shutil.which(mode) or mode,))


def _command(mode: Isolation, host_dir: str) -> list[str]:
    if mode == "none":
        return []
    return _BUILDERS[mode](host_dir, os.geteuid() == 0)


def _write_main(host_dir: str, code: str) -> None:
    os.chmod(host_dir, 0o755)  # the unprivileged child must read the bound main.py
    path = os.path.join(host_dir, "main.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(code)
    os.chmod(path, 0o644)


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_chars: int = 4000,
    settings: SandboxSettings | None = None,
) -> SandboxResult:
    """Run `code` as a script; never raises for anything the snippet does.

    Raises `SandboxUnavailableError` before running anything when no isolation tool works
    and the user did not opt in to unisolated runs.
    """
    settings = settings or SandboxSettings()
    mode = isolation_tool(settings)
    if mode == "none":
        log.warning(
            "RUNNING UNTRUSTED CODE WITHOUT ISOLATION (AGENTRL_SANDBOX_ALLOW_UNISOLATED=1): the "
            "snippet can read and write your files and reach the network"
        )

    with tempfile.TemporaryDirectory(prefix="agentrl-code-") as host_dir:
        _write_main(host_dir, code)
        isolated = mode != "none"
        workdir = WORKDIR if isolated else host_dir
        script = SCRIPT if isolated else os.path.join(host_dir, "main.py")
        limits = _LIMITS.format(
            workdir=workdir,
            mem=memory_mb * 1024 * 1024,
            cpu=max(1, int(timeout_s) + 1),
            fsize=settings.max_file_bytes,
            nproc=settings.max_processes,
        )
        runner = limits + _RUNNER.format(script=script)
        cmd = [*_command(mode, host_dir), sys.executable, "-I", "-c", runner]
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        started = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            cwd=host_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            out, err = proc.communicate()
        duration = time.perf_counter() - started
    return SandboxResult(
        stdout=_truncate(out.decode("utf-8", "replace"), max_output_chars),
        stderr=_truncate(err.decode("utf-8", "replace"), max_output_chars),
        returncode=None if timed_out else proc.returncode,
        timed_out=timed_out,
        isolation=mode,
        duration_s=duration,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [truncated {len(text) - limit} characters]"
