"""`agentrl agent-zero install PATH --python PY` puts agentrl's client (agentrl-a0-client, no
torch, no upper Python bound) into Agent Zero's own Python: here a fresh Python 3.12 venv
(Agent Zero's version), where the installed plugin then records and publishes a monologue
to a real nats-server, with torch nowhere in that environment."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from a0_kit import Checkout, trajectories_of
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
    script = textwrap.dedent(
        f"""
        import asyncio, importlib.util, json, sys
        assert sys.version_info[:2] == (3, 12), sys.version
        assert importlib.util.find_spec("torch") is None, "torch in Agent Zero's Python"
        sys.path[:0] = [{str(checkout.root)!r}, {str(HERE)!r}]
        from pathlib import Path
        from a0_standins import Agent, Config, Context, Driver, Extensions, Message
        rec = json.loads(Path({str(HERE / "data" / "main_with_tools.json")!r}).read_text())
        ext = Extensions([Path({str(checkout.plugin_dir / "extensions" / "python")!r})])
        agent = Agent(0, Config("agent0"), Context("a0-py312"))
        agent.last_user_message = Message(rec["user_message"]["content"], "m-1")
        print("ANSWER", asyncio.run(Driver(ext).monologue(agent, rec["iterations"])))
        import agentrl.integrations.agent_zero.hooks as hooks
        print("FROM", hooks.__file__)
        """
    )
    # Agent Zero's own Python: not this checkout's PYTHONPATH (a worktree's tests set it)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(a0_python), "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "ANSWER The sum of [1, 2, 3] is 6." in done.stdout
    assert str(venv) in done.stdout.split("FROM", 1)[1]  # the client, not this checkout
    (payload,) = await_trajectories(a0_nats.url, "a0-py312")
    assert [t["action"]["tool_name"] for t in payload["turns"]] == [
        "code_execution_tool",
        "response",
    ]


def await_trajectories(url: str, session: str) -> list[dict[str, Any]]:
    import asyncio

    return asyncio.run(trajectories_of(url, session))


def test_no_interpreter_found_is_a_clear_error(checkout: Checkout) -> None:
    result = CliRunner().invoke(app, ["agent-zero", "install", str(checkout.root)])
    if Path("/opt/venv-a0/bin/python").exists():
        pytest.skip("this machine has Agent Zero's image interpreter")
    assert result.exit_code == 2
    assert "--python" in result.output and "inactive" in result.output
    assert json.loads((checkout.plugin_dir / "config.json").read_text())  # the plugin is there
