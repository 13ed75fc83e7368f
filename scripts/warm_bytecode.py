"""Writes the bytecode of what agentrl's commands and tests import, once, in one process.

Without it the first few processes of the suite (three pytest workers, the services and
jobs they start) would each compile the same few thousand modules at once. It is kept for
hosts that set PYTHONDONTWRITEBYTECODE outside these scripts (a process that may not write
bytecode compiles what it imports every time). `scripts/setup.sh` runs it after installing;
`scripts/test.sh` runs it beside mypy and the gateway front's build, which do not import
these modules.
"""

import importlib
import sys

MODULES = (
    "agentrl.cli",
    "agentrl.llm.loading",
    "agentrl.app.loop",
    "torch",
    "transformers",
    "peft",
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

if __name__ == "__main__":
    sys.dont_write_bytecode = False
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # an optional part that does not import here: its tests say so
            pass
