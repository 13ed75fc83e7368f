"""The client wheel's files are enough on their own: laid out as `agentrl agent-zero install`
ships them, the client's modules import from there and from nowhere else (a module that
agentrl's own `__init__` or a shipped module imports, left out of `client.MODULES`, broke the
client on Python 3.12 while every in-tree test passed, 2026-11-30). Fast, in-tree Python; the
test script's 3.12 step installs the real wheel."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import agentrl
from agentrl.integrations.agent_zero.client import client_files

CHECK = """
import importlib, pkgutil, sys
root = sys.argv[1]
import agentrl
import agentrl.integrations.agent_zero as a0
for m in pkgutil.iter_modules(a0.__path__):
    if m.name not in ("cli", "install", "options"):  # the CLI side stays in the main install
        importlib.import_module(f"agentrl.integrations.agent_zero.{m.name}")
import agentrl.bus, agentrl.rewards
outside = sorted(n for n, m in sys.modules.items() if n.startswith("agentrl")
                 and not (getattr(m, "__file__", None) or root).startswith(root))
assert not outside, outside
print("ok")
"""


def test_the_shipped_files_import_on_their_own(tmp_path: Path) -> None:
    package_root = Path(agentrl.__file__).parent
    for path, name in client_files(package_root):
        dest = tmp_path / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    root = str(tmp_path / "agentrl")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); exec(sys.stdin.read())"
    done = subprocess.run(
        [sys.executable, "-c", code, root],
        input=CHECK,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
