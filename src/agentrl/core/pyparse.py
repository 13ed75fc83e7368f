"""`ast.parse` that threads may call at once.

CPython 3.11 up to 3.11.7 keeps the AST validator's recursion depth in interpreter-wide state
without a lock, so two threads parsing together can fail with "SystemError: AST constructor
recursion depth mismatch" (CPython gh-106905). The tool-use environment steps episodes in
threads (its calculator parses), as does the suite's solver check: the suite failed on it
once (2026-11-28). Parses here are short, so one lock costs nothing measurable."""

from __future__ import annotations

import ast
import threading
from typing import Any

_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> Any:
    with _LOCK:
        return ast.parse(source, mode=mode)
