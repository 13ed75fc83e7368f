"""`agentrl agent-zero install PATH --python PY` puts agentrl's client (agentrl-a0-client, no
torch, no upper Python bound) into Agent Zero's own Python: here a fresh Python 3.12 venv
(Agent Zero's version), where the installed plugin then records and publishes a monologue
to a real nats-server, with torch nowhere in that environment (`a0_python_monologue.py`).
scripts/test.sh makes the same checks in its own Python 3.12 step (`follow_guide.py`, on the
install the guide's lines made) and sets AGENTRL_A0_PY312_STEP, which skips that test here:
one install of the client per run instead of two (~20 CPU-s)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from a0_kit import Checkout
from typer.testing import CliRunner

import agentrl
from agentrl.cli import app
from agentrl.integrations.agent_zero import client

HERE = Path(__file__).parent


def python312() -> str | None:
    """A real Python 3.12 (pyenv's own binary: its shim needs a selected version)."""
    home = Path.home() / ".pyenv" / "versions"
    pyenv = sorted(glob.glob(str(home / "3.12*" / "bin" / "python3.12")))
    if pyenv:
        return pyenv[-1]
    found = shutil.which("python3.12")
    return found if found and "shims" not in found else None


def test_the_wheel_holds_the_client_and_nothing_heavy(tmp_path: Path) -> None:
    wheel = client.build_wheel(Path(agentrl.__file__).parent, tmp_path, "9.9.9")
    assert wheel.name == "agentrl_a0_client-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = zf.read("agentrl_a0_client-9.9.9.dist-info/METADATA").decode()
    assert "agentrl/integrations/agent_zero/recorder.py" in names
    assert "agentrl/rewards/redact.py" in names and "agentrl/bus/client.py" in names
    # the structured-outputs setting's schema, beside the module that reads it
    assert "agentrl/integrations/agent_zero/agent_zero_response.json" in names
    assert not any(
        n.startswith(("agentrl/training/", "agentrl/llm/", "agentrl/serving/", "agentrl/release/"))
        for n in names
    )
    assert "Requires-Python: >=3.11\n" in meta  # no upper bound
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist")]
    assert not any(("torch" in r or "transformers" in r) for r in requires)
    assert len(requires) <= 8


@pytest.mark.skipif(
    bool(os.environ.get("AGENTRL_A0_PY312_STEP")),
    reason="scripts/test.sh's Python 3.12 step makes these checks on its own install "
    "(clients/agentrl-a0-client/follow_guide.py): the client is installed once per run",
)
def test_install_into_a_python_312_without_torch(
    checkout: Checkout, a0_nats: Any, tmp_path: Path
) -> None:
    py = python312()
    if py is None:
        pytest.skip("no Python 3.12 on this machine (pyenv install 3.12)")
    venv = tmp_path / "a0-venv"
    subprocess.run([py, "-m", "venv", str(venv)], check=True, timeout=120)
    a0_python = venv / "bin" / "python"
    result = CliRunner().invoke(
        app, ["agent-zero", "install", str(checkout.root), "--python", str(a0_python)]
    )
    assert result.exit_code == 0, result.output
    assert "installed agentrl-a0-client" in result.output
    assert "pip install agentrl" not in result.output
    # Agent Zero's own Python: not this checkout's PYTHONPATH (a worktree's tests set it)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    monologue = [str(HERE / "a0_python_monologue.py"), str(checkout.root), "a0-py312", a0_nats.url]
    done = subprocess.run(
        [str(a0_python), *monologue],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["python"] == [3, 12] and got["torch"] is False  # no torch in Agent Zero's Python
    assert got["answer"] == "The sum of [1, 2, 3] is 6."
    assert got["hooks_from"].startswith(str(venv))  # the client, not this checkout
    assert got["tool_names"] == [["code_execution_tool", "response"]]  # one, on the bus


def test_no_interpreter_found_is_a_clear_error(checkout: Checkout) -> None:
    result = CliRunner().invoke(app, ["agent-zero", "install", str(checkout.root)])
    if Path("/opt/venv-a0/bin/python").exists():
        pytest.skip("this machine has Agent Zero's image interpreter")
    assert result.exit_code == 2
    assert "--python" in result.output and "inactive" in result.output
    assert json.loads((checkout.plugin_dir / "config.json").read_text())  # the plugin is there


def test_the_client_installs_by_uv_where_it_is_and_by_pip_after_uv_fails(tmp_path: Path) -> None:
    """uv first (setup.sh puts it beside agentrl's Python), pip when uv fails: both tried,
    both named in the error when both fail. The success of each is the 3.12 install above
    (and scripts/test.sh's step), which goes through `find_uv()`."""
    beside = Path(sys.executable).parent / "uv"
    assert client.find_uv() == (str(beside) if beside.exists() else shutil.which("uv"))
    wheel = client.build_wheel(Path(agentrl.__file__).parent, tmp_path, "0.0.1")
    no_python = tmp_path / "no-such" / "python"
    with pytest.raises(RuntimeError) as failed:
        client.install_client(no_python, wheel, uv=shutil.which("false") or "/bin/false")
    said = str(failed.value)
    assert "pip install --quiet --python" in said  # uv's attempt, then
    assert f"{no_python} -m pip install" in said  # pip's
    with pytest.raises(RuntimeError) as pip_only:
        client.install_client(no_python, wheel, uv="")
    assert "pip install --quiet --python" not in str(pip_only.value)  # no uv: pip alone
    assert f"{no_python} -m pip install" in str(pip_only.value)
