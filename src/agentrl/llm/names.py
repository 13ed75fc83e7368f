"""The model names and file names the serving side needs without loading a model.

`agentrl.llm.loading` imports torch and transformers (~7 CPU-s a process); `agentrl up`
serving through vLLM, the deployment controller and the vLLM backend only need these names
and the atomic folder save, so they import them from here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Names a user may pass for the bundled model; "tiny" is a random model for tests and benches.
SMOLLM2_ALIASES = frozenset(
    {"smollm2", "smollm2-135m", "smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct"}
)
TINY_ALIASES = frozenset({"tiny", "tiny-random"})
# how a checkpoint's base model was built, beside its adapter
BASE_FILE = "agentrl_base.json"


def atomic_save(target: Path, save: Callable[[Path], Any]) -> Path:
    """Save into a temp folder beside `target`, then rename, so readers never see half a
    model even when two processes convert at once."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
