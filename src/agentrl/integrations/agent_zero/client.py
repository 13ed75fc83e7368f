"""agentrl's client for Agent Zero: the part of agentrl the plugin runs, as its own wheel.

Agent Zero runs in its own Python (3.12 in its image, /opt/venv-a0) and must not get
agentrl's training stack (torch, transformers, ray, ...). The plugin needs only the event
contracts, the bus client, redaction, and this package (recorder, spool, publisher), so the
client distribution `agentrl-a0-client` ships exactly those modules of the `agentrl` package
(imported as `agentrl`, as in a full install) with a handful of small dependencies and no
upper Python bound. `agentrl agent-zero install PATH` builds it from the agentrl it runs from
and pip-installs it into Agent Zero's interpreter; `clients/agentrl-a0-client` builds the
same wheel from a checkout (its PEP 517 backend loads this file).

Only the standard library is used here: the checkout's build backend loads this file alone.
Do not install the client into an environment that has the full agentrl (they share files).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

DIST_NAME = "agentrl-a0-client"
REQUIRES_PYTHON = ">=3.11"
# what the shipped modules import at module level (see MODULES); nothing heavy
DEPENDENCIES = (
    "pydantic>=2.7",
    "pydantic-settings>=2.3",
    "nats-py>=2.9",
    "numpy>=1.26",
    "orjson>=3.10",
    "PyYAML>=6",
    "prometheus-client>=0.20",
    "httpx>=0.27",
)
# relative to the agentrl package: whole folders, and single files
PACKAGES = ("contracts", "bus", "observability", "rewards", "integrations/agent_zero")
MODULES = (
    "__init__.py",
    "py.typed",
    "core/__init__.py",
    "core/aiohttp_on_use.py",
    "core/deathsig.py",
    "core/errors.py",
    "core/settings.py",
    "core/pyparse.py",
    "integrations/__init__.py",
)
# files shipped under another name: the structured-outputs setting's schema (deploy/ is not
# the client's; integrations/agent_zero/structured.py reads it beside itself in the client)
RENAMED = (
    (
        "serving/schemas/agent_zero_response.json",
        "integrations/agent_zero/agent_zero_response.json",
    ),
)
# folders of the shipped packages that are not the client's (CLIs import typer)
LEAVE_OUT = ("cli.py",)
# where Agent Zero's interpreter usually is: its docker image, then a venv in the checkout
INTERPRETERS = ("/opt/venv-a0/bin/python", ".venv/bin/python", "venv/bin/python")


def client_files(package_root: Path) -> Iterator[tuple[Path, str]]:
    """(file, name in the wheel) of every file the client ships, from an agentrl folder."""
    for rel in MODULES:
        path = package_root / rel
        if path.is_file():
            yield path, f"agentrl/{rel}"
    for rel, name in RENAMED:
        if (package_root / rel).is_file():
            yield package_root / rel, f"agentrl/{name}"
    for rel in PACKAGES:
        folder = package_root / rel
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            if path.name in LEAVE_OUT and path.parent == folder:
                continue
            yield path, f"agentrl/{path.relative_to(package_root).as_posix()}"


def _digest(data: bytes) -> str:
    raw = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={raw.decode()}"


def metadata(version: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {DIST_NAME}",
        f"Version: {version}",
        "Summary: agentrl's client for Agent Zero: trajectory recorder, spool and publisher",
        f"Requires-Python: {REQUIRES_PYTHON}",
        *(f"Requires-Dist: {d}" for d in DEPENDENCIES),
    ]
    return "\n".join(lines) + "\n"


def build_wheel(package_root: Path, out_dir: Path, version: str) -> Path:
    """Write `agentrl_a0_client-<version>-py3-none-any.whl` into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = DIST_NAME.replace("-", "_")
    info = f"{stem}-{version}.dist-info"
    wheel = out_dir / f"{stem}-{version}-py3-none-any.whl"
    record: list[str] = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:

        def add(name: str, data: bytes) -> None:
            zf.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
            record.append(f"{name},{_digest(data)},{len(data)}")

        for path, name in client_files(package_root):
            add(name, path.read_bytes())
        add(f"{info}/METADATA", metadata(version).encode())
        wheel_meta = "Wheel-Version: 1.0\nGenerator: agentrl\nRoot-Is-Purelib: true\n"
        add(f"{info}/WHEEL", (wheel_meta + "Tag: py3-none-any\n").encode())
        record.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("agentrl", DIST_NAME):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "0.0.0"


def find_interpreter(root: Path, python: str | None = None) -> Path:
    """Agent Zero's Python: `python` if given, else the first of INTERPRETERS that exists."""
    if python:
        path = Path(python)
        if not path.exists():
            raise FileNotFoundError(f"no Python at {python}")
        return path
    for cand in INTERPRETERS:
        path = Path(cand) if cand.startswith("/") else root / cand
        if path.exists():
            return path
    raise FileNotFoundError(
        f"could not find Agent Zero's Python (looked for {', '.join(INTERPRETERS)} under "
        f"{root}); pass --python /path/to/agent-zero's/python"
    )


def find_uv() -> str | None:
    """uv beside agentrl's own Python (`scripts/setup.sh` installs it there), else on PATH."""
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else shutil.which("uv")


def install_client(
    python: Path, wheel: Path, extra_args: tuple[str, ...] = (), uv: str | None = None
) -> str:
    """Install the client wheel (and its dependencies) into `python`; the installer's output.

    By uv where it is (`uv`, else `find_uv()`; "" for none) and no pip arguments are given:
    ~0.5 CPU-s where pip resolves for ~13. By pip when uv is absent or fails: uv reads no
    pip.conf, so an index or mirror that only pip's settings name is still reached, and a
    Python that uv will not install into (a system one) gets pip's own answer."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    uv = find_uv() if uv is None else uv
    tried = ""
    if uv and not extra_args:
        cmd = [uv, "pip", "install", "--quiet", "--python", str(python), str(wheel)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode == 0:
            return done.stdout + done.stderr
        tried = f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}\nthen "
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    cmd += [*extra_args, str(wheel)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    except OSError as exc:  # no such Python
        raise RuntimeError(f"{tried}{' '.join(cmd)} failed: {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(
            f"{tried}{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
        )
    return done.stdout
