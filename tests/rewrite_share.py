"""xdist workers share pytest's assertion rewriting of the test modules in a fresh checkout.

Every worker collects every test module, and pytest rewrites each module's asserts on its
first import, then caches the result (`__pycache__/*-pytest-*.pyc`). In a fresh clone no
cache exists yet and the workers start together: each of them rewrote all ~260 modules
(~10 CPU-s a worker, measured at load 5-6 on 2026-11-30: `--collect-only -n 0` cold 27.4-28.0
against warm 16.6-17.5 CPU-s). Here each worker first rewrites its share (every Nth module),
writing pytest's own cache file, and then collects as always, reading the others' shares
from the cache: one rewrite of each module instead of one per worker. A module whose cache
is not there yet when collection reaches it is rewritten by pytest as before (a race costs
time, never a wrong module: pytest checks a cached file's source hash and writes it
atomically)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def _share(config: pytest.Config, worker: int, workers: int) -> list[Path]:
    """This worker's modules: every `workers`th of the sorted test modules and conftests
    under the run's arguments (the paths of `pytest PATH...`, else `testpaths`)."""
    patterns = [*config.getini("python_files"), "conftest.py"]
    found: set[Path] = set()
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path.is_file():
            found.add(path)
        elif path.is_dir():
            found.update(
                module
                for pattern in patterns
                for module in path.rglob(pattern)
                if module.suffix == ".py" and "__pycache__" not in module.parts
            )
    return sorted(found)[worker::workers]


def _rewrite_into_cache(config: pytest.Config, paths: list[Path]) -> int:
    """Rewrite and cache each module the way pytest's import hook does; the number written.
    Uses pytest's own rewrite and cache functions (private: on any change of them this
    does nothing and pytest rewrites at import, as without it)."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return 0
    needed = ("PYC_TAIL", "_read_pyc", "_rewrite_test", "_write_pyc", "get_cache_dir")
    state = config.stash.get(rewrite.assertstate_key, None)
    if state is None or not all(hasattr(rewrite, name) for name in needed):
        return 0
    written = 0
    for path in paths:
        cache_dir = rewrite.get_cache_dir(path)
        pyc = cache_dir / (path.name[:-3] + rewrite.PYC_TAIL)
        if pyc.exists():
            continue  # another worker's, or a run's before: pytest checks it at import
        try:
            cache_dir.mkdir(exist_ok=True)
            source_hash, code = rewrite._rewrite_test(path, config)
        except (OSError, SyntaxError):
            continue  # pytest reports it at collection, as without this
        written += rewrite._write_pyc(state, code, source_hash, pyc)
    return written


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    """An xdist worker's share of the rewriting, before its collection."""
    config = session.config
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or sys.dont_write_bytecode:
        return  # one process rewrites each module once anyway; nothing cached to share
    if config.getoption("assertmode", "rewrite") != "rewrite":
        return
    worker = int(workerinput.get("workerid", "gw0").removeprefix("gw") or 0)
    workers = int(workerinput.get("workercount", os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1)))
    if workers < 2:
        return
    _rewrite_into_cache(config, _share(config, worker, workers))
