"""`log_to_file` quiets transformers (its records to the root's handlers, no progress bars)
without importing it: at once where it is imported, at its import where it is not (importing
it only for this cost `agentrl soak` ~1.7 CPU-s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = """
import logging, sys
from agentrl.core.logs import log_to_file
log_to_file(sys.argv[1])
print("imported by log_to_file:", "transformers" in sys.modules)
from transformers.utils import logging as tl
tl.get_logger("transformers.modeling_utils").warning("a load report")
import huggingface_hub.utils as hub
lg = logging.getLogger("transformers")
print("propagate:", lg.propagate, "handlers:", len(lg.handlers))
print("bars:", tl.is_progress_bar_enabled(), hub.are_progress_bars_disabled())
"""


def test_transformers_is_quieted_at_its_import_not_imported_for_it(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "imported by log_to_file: False" in proc.stdout, proc.stdout + proc.stderr
    assert "propagate: True handlers: 0" in proc.stdout, proc.stdout + proc.stderr
    assert "bars: False True" in proc.stdout, proc.stdout + proc.stderr
    assert "a load report" in log.read_text()  # to the file, through the root's handler
    assert "a load report" not in proc.stderr  # not transformers' own stderr handler


def test_after_import_runs_at_once_for_a_module_already_imported() -> None:
    from agentrl.core.logs import after_import

    seen: list[str] = []
    after_import("json", lambda module: seen.append(module.__name__))
    assert seen == ["json"]
