"""Follow the Agent Zero guide's install section line by line, as a new user would.

Run by CI's Python 3.12 step with agentrl's own interpreter (`.venv/bin/python
clients/agentrl-a0-client/follow_guide.py --python FRESH_312_VENV/bin/python`): the first
```bash block under "## Install" in docs/guide/agent_zero.md is run command by command, with
only its placeholders replaced: `/path/to/agent-zero` by an Agent Zero-shaped folder,
`/opt/venv-a0/bin/python` by the fresh venv (Agent Zero's Python), and the ports 4222, 8700
and 8600 by free ones (so it never meets another stack). `agentrl up` runs in the background
until the gateway answers, and is stopped with Ctrl-C (SIGINT) at the end. Then it checks what
the guide promises: the client imports in that Python (without torch), the plugin there reads
the URLs `install` was given, and `install` printed the served model's `ctx_length` and that
it installed agentrl-a0-client. Last, that Python runs a recorded monologue through the
installed plugin (tests/integrations/agent_zero/a0_python_monologue.py), which publishes it
to the stack's NATS: the checks of test_agent_zero_client.py's Python 3.12 test, which
scripts/test.sh skips (AGENTRL_A0_PY312_STEP) so that one run installs the client once.
Standard library only; exits non-zero with the failing line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide" / "agent_zero.md"
MONOLOGUE = ROOT / "tests" / "integrations" / "agent_zero" / "a0_python_monologue.py"
PORTS = ("4222", "8700", "8600")


def install_lines(text: str) -> list[str]:
    """The commands of the first ```bash block of the "## Install" section (continuation
    lines joined, comments and blank lines dropped)."""
    section = text.split("\n## Install", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    if block is None:
        raise SystemExit("no ```bash block in the guide's install section")
    joined = block.group(1).replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(" ".join(line.split()))
    return out


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def agent_zero_folder(base: Path) -> Path:
    """What `install` recognises as Agent Zero (plugin layout: helpers/extension.py)."""
    root = base / "agent-zero"
    (root / "helpers").mkdir(parents=True)
    (root / "helpers" / "__init__.py").write_text("")
    (root / "helpers" / "extension.py").write_text(
        "class Extension:\n    def __init__(self, agent, **kwargs):\n        self.agent = agent\n"
    )
    (root / "usr").mkdir()
    return root


def wait_for(url: str, timeout: float, up: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if up.poll() is not None:
            raise SystemExit(f"`agentrl up` exited ({up.returncode}) before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"{url} did not answer within {timeout:.0f} s")


def monologue(python: str, a0: Path, nats_url: str, env: dict[str, str], cwd: Path) -> None:
    """The installed plugin records a monologue in `python` and publishes it to `nats_url`."""
    cmd = [python, str(MONOLOGUE), str(a0), "a0-guide-py312", nats_url]
    got = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        raise SystemExit(f"[guide] the monologue in {python} failed:\n{got.stderr}")
    result = json.loads(got.stdout.splitlines()[-1])
    venv = str(Path(python).parent.parent)
    if not (
        result["python"] == [3, 12]
        and result["torch"] is False
        and result["answer"] == "The sum of [1, 2, 3] is 6."
        and result["hooks_from"].startswith(venv)  # the client, not this checkout
        and result["tool_names"] == [["code_execution_tool", "response"]]  # one, on the bus
    ):
        raise SystemExit(f"[guide] the monologue in {python}: {result}")
    print(f"[guide] the plugin published a monologue from {python}: {result['tool_names']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="A fresh venv's python (Agent Zero's).")
    ap.add_argument("--up-timeout", type=float, default=600.0)
    args = ap.parse_args()
    agentrl = Path(sys.executable).with_name("agentrl")
    lines = install_lines(GUIDE.read_text())
    ports = {p: free_port() for p in PORTS}
    base = Path(tempfile.mkdtemp(prefix="a0-guide-"))
    a0 = agent_zero_folder(base)
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}
    env.update(
        AGENTRL_DATA_DIR=str(base / "agentrl"),
        AGENTRL_GATEWAY_PORT=ports["8700"],
        AGENTRL_API_PORT=ports["8600"],
    )
    # the converted model stays where a user's `agentrl up` keeps it (AGENTRL_MODELS_DIR if
    # set, else the user cache the test suite's stacks share): a folder of the clone's own
    # made each fresh clone convert SmolLM2 from its GGUF again (~15 CPU-s beside pytest)

    def concrete(line: str) -> list[str]:
        line = line.replace("/path/to/agent-zero", str(a0))
        line = line.replace("/opt/venv-a0/bin/python", args.python)
        for default, port in ports.items():
            line = re.sub(rf"(?<=:){default}\b", port, line)
            line = re.sub(rf"(?<=--port ){default}\b", port, line)
        words = shlex.split(line)
        if words[0] != "agentrl":
            raise SystemExit(f"the guide's install section runs more than agentrl: {line}")
        return [str(agentrl), *words[1:]]

    up: subprocess.Popen[bytes] | None = None
    printed = ""
    try:
        for line in lines:
            cmd = concrete(line)
            print(f"[guide] $ {shlex.join(cmd)}", flush=True)
            started = time.monotonic()
            if cmd[1] == "up":
                log = (base / "up.log").open("wb")
                up = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
                wait_for(f"http://127.0.0.1:{ports['8700']}/v1/models", args.up_timeout, up)
                print(f"[guide] the gateway answers after {time.monotonic() - started:.0f} s")
                continue
            done = subprocess.run(cmd, cwd=base, env=env, capture_output=True, text=True)
            printed += done.stdout
            print(done.stdout + done.stderr, flush=True)
            if done.returncode != 0:
                raise SystemExit(f"[guide] failed ({done.returncode}): {line}")
        check = (
            "import importlib.util, json, sys\n"
            "assert importlib.util.find_spec('torch') is None\n"
            "from agentrl.integrations.agent_zero.config import load_config\n"
            f"c = load_config(__import__('pathlib').Path({str(a0 / 'usr/plugins/agentrl')!r}))\n"
            "print(json.dumps([sys.version_info[:2], c.nats_url, c.gateway_url, c.api_url]))\n"
        )
        clean = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        got = subprocess.run(
            [args.python, "-c", check], cwd=base, env=clean, capture_output=True, text=True
        )
        if got.returncode != 0:
            raise SystemExit(f"[guide] the client in {args.python} failed:\n{got.stderr}")
        version, nats_url, gateway_url, api_url = json.loads(got.stdout)
        want = [
            f"nats://127.0.0.1:{ports['4222']}",
            f"http://127.0.0.1:{ports['8700']}/v1",
            f"http://127.0.0.1:{ports['8600']}",
        ]
        if [nats_url, gateway_url, api_url] != want:
            raise SystemExit(f"[guide] the plugin reads {nats_url, gateway_url, api_url}")
        if not re.search(r"ctx_length:\s+\d+", printed):
            raise SystemExit("[guide] install printed no ctx_length from the gateway")
        if "installed agentrl-a0-client" not in printed or "pip install agentrl" in printed:
            raise SystemExit("[guide] install did not say it installed agentrl-a0-client")
        monologue(args.python, a0, want[0], clean, base)
        print(f"[guide] followed on Python {version[0]}.{version[1]}: the plugin reads {want}")
        return 0
    finally:
        if up is not None:
            up.send_signal(signal.SIGINT)  # Ctrl-C
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
