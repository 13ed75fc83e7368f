"""Opt-in `--cpu-report PATH`: CPU seconds per test file, to rank what the suite spends.

Wall time per test hides where the CPU goes (a test waiting on a subprocess shows wall, the
subprocess burns CPU). Per file this records user+sys of the pytest process and of every
child it started and reaped (`getrusage`'s RUSAGE_CHILDREN covers grandchildren whose parents
waited on them); a process's start-up and collection come as a line of their own. A child a
test never waited on is counted where it is reaped (often at the next `subprocess.Popen`), so
check a surprise with the file alone. `--cpu-report-by test` records per test. With xdist
each worker appends its own JSON lines; `.venv/bin/python tests/cpu_report.py PATH` ranks them.
The start-up line's `start_up_s` is the part before collection (Python, pytest, its plugins,
the conftests): the rest of its `self_s` is the collection (the test modules' imports).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Generator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        default=None,
        metavar="PATH",
        help="append one JSON line per test file (CPU s of the process and its children) to PATH",
    )
    parser.addoption(
        "--cpu-report-by",
        default="file",
        choices=("file", "test"),
        help="--cpu-report's unit: a test file (default) or a test",
    )


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


class _Recorder:
    def __init__(self, path: Path, by_test: bool) -> None:
        self.path = path
        self.by_test = by_test
        # the process's own start-up (imports, plugins) and collection, up to its first test
        self.file: str | None = "(start-up and collection)"
        self.start = (0.0, 0.0)
        import psutil

        self.wall = time.monotonic() - (time.time() - psutil.Process().create_time())
        self.tests = 0
        self.start_up_s: float | None = None  # the process's own CPU-s at `pytest_sessionstart`

    def begin(self, file: str) -> None:
        if file == self.file:
            return
        self.flush()
        self.file, self.start, self.wall, self.tests = file, _cpu(), time.monotonic(), 0

    def flush(self) -> None:
        if self.file is None:
            return
        me, kids = _cpu()
        line = {
            "file": self.file,
            "tests": self.tests,
            "cpu_s": round(me - self.start[0] + kids - self.start[1], 2),
            "self_s": round(me - self.start[0], 2),
            "children_s": round(kids - self.start[1], 2),
            "wall_s": round(time.monotonic() - self.wall, 2),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }
        if self.file == "(start-up and collection)" and self.start_up_s is not None:
            line["start_up_s"] = round(self.start_up_s, 2)
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")
        self.file = None


_recorder: _Recorder | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _recorder
    path = config.getoption("--cpu-report")
    if path:
        by_test = config.getoption("--cpu-report-by") == "test"
        _recorder = _Recorder(Path(path).resolve(), by_test)


def pytest_sessionstart(session: pytest.Session) -> None:
    if _recorder is not None:
        _recorder.start_up_s = _cpu()[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    if _recorder is not None:
        _recorder.begin(item.nodeid if _recorder.by_test else item.nodeid.split("::")[0])
        _recorder.tests += 1
    yield


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _recorder is not None:
        _recorder.flush()


def _rank(path: str) -> None:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    rows.sort(key=lambda r: -r["cpu_s"])
    total = sum(r["cpu_s"] for r in rows)
    print(f"{'cpu_s':>8} {'self':>7} {'kids':>7} {'wall':>7} {'n':>4}  file")
    for r in rows:
        print(
            f"{r['cpu_s']:8.1f} {r['self_s']:7.1f} {r['children_s']:7.1f} "
            f"{r['wall_s']:7.1f} {r['tests']:4d}  {r['file']}"
        )
    print(f"{total:8.1f} in all over {len(rows)} files")


if __name__ == "__main__":
    _rank(sys.argv[1])
