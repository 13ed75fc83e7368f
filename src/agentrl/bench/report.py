"""How every benchmark reports: a readable rich table, then one JSON line of named figures.

The JSON line is always the last thing printed so scripts can `tail -n1 | jq`.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def machine() -> str:
    """A short description of this machine for BENCHMARKS.md."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def report(
    title: str,
    rows: Sequence[Mapping[str, Any]],
    figures: Mapping[str, Any],
    console: Console | None = None,
) -> dict[str, Any]:
    """Print `rows` as a table titled `title`, then `figures` as the final JSON line."""
    console = console or Console()
    if rows:
        table = Table(title=title)
        columns = list(dict.fromkeys(k for row in rows for k in row))
        for col in columns:
            table.add_column(str(col))
        for row in rows:
            table.add_row(*(_fmt(row.get(col, "")) for col in columns))
        console.print(table)
    out = {"benchmark": title, "date": time.strftime("%Y-%m-%d"), "machine": machine(), **figures}
    # print() not console.print(): the last line must be plain, unwrapped JSON.
    print(json.dumps(out, default=_json_default), flush=True)
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def _json_default(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
