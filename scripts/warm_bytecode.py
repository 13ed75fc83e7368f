"""Writes the bytecode of what agentrl's commands and tests import, once, in two processes.

Without it the first few processes of the suite (three pytest workers, the services and
jobs they start) would each compile the same few thousand modules at once. It is kept for
hosts that set PYTHONDONTWRITEBYTECODE outside these scripts (a process that may not write
bytecode compiles what it imports every time). `scripts/setup.sh` runs it after installing;
`scripts/test.sh` runs it beside mypy and the gateway front's build, which do not import
these modules.

The model stack (torch and what imports it) and the rest share almost no module, so a
second process takes the rest beside it: ~25 and ~13 CPU-s from nothing, ~25 s of wall on
two cores instead of ~34 (2026-11-30).
"""

import contextlib
import importlib
import subprocess
import sys

MODEL_STACK = (
    "agentrl.cli",
    "agentrl.llm.loading",
    "agentrl.app.loop",
    "torch",
    "transformers",
    "peft",
)
THE_REST = (
    "chdb",
    "ray",
    "gymnasium",
    "matplotlib.pyplot",
    "fastapi",
    "uvicorn",
    "openai",
    "hypothesis",
    "pytest",
    "xdist",
    "mypy.main",
)


def import_all(names: tuple[str, ...]) -> None:
    for name in names:
        # an optional part that does not import here: its tests say so
        with contextlib.suppress(Exception):
            importlib.import_module(name)


if __name__ == "__main__":
    sys.dont_write_bytecode = False
    if sys.argv[1:] == ["--the-rest"]:
        import_all(THE_REST)
    else:
        rest = subprocess.Popen([sys.executable, __file__, "--the-rest"])
        import_all(MODEL_STACK)
        rest.wait()
