"""The modules the stack's processes start from import no model stack: every service of
`agentrl up`, a replica (`python -m agentrl.app.stack`), a gateway worker and the training
worker and launcher. torch, transformers and peft cost ~7.5 CPU-s a process and openai ~1.5
(s28's measures); what needs them (the local engine, a job, validation) imports them where
it uses them. In the suite run of 2026-11-30 (s29's /proc samples) 25 service processes ran
with no model: 12 `agentrl rewards serve`, 5 `agentrl deploy serve` in front of an upstream,
3 gateway workers, 2 `agentrl warehouse serve`, 2 `agentrl train serve` and 1 replica.
"""

from __future__ import annotations

import json
import subprocess
import sys

from agentrl.app.stack import SERVICES

ENTRIES = (
    *(path.split(":")[0] for _, path in SERVICES),
    "agentrl.app.stack",
    "agentrl.release.gateway_worker",
    "agentrl.training.worker",
    "agentrl.training.launcher",
)
HEAVY = ("torch", "transformers", "peft", "openai")

CODE = f"""
import importlib, json, sys
loaded = {{}}
for name in sys.argv[1:]:
    importlib.import_module(name)
    loaded[name] = sorted(m for m in {HEAVY!r} if m in sys.modules)
print(json.dumps(loaded))
"""


def test_the_stacks_process_entries_import_no_model_stack() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CODE, *ENTRIES],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(loaded) == list(ENTRIES)
    assert {name: mods for name, mods in loaded.items() if mods} == {}, loaded
