"""The collector's young generation at an agentrl process's start (`agentrl.core.gcstart`):
the `agentrl` command raises it before its command's imports, and a collector turned off or
set larger by the user is left as it is."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agentrl.core.gcstart import YOUNG, raise_young_generation


@pytest.fixture
def threshold() -> Iterator[None]:
    was = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*was)


@pytest.mark.usefixtures("threshold")
def test_the_young_generation_is_raised_and_a_users_choice_kept() -> None:
    gc.set_threshold(700, 10, 10)  # CPython's default
    raise_young_generation()
    assert gc.get_threshold() == (YOUNG, 10, 10)
    gc.set_threshold(50_000, 5, 7)  # larger already: kept
    raise_young_generation()
    assert gc.get_threshold() == (50_000, 5, 7)
    gc.set_threshold(0, 10, 10)  # the collector off on purpose: stays off
    raise_young_generation()
    assert gc.get_threshold() == (0, 10, 10)


_MAIN = """
import gc, sys
from agentrl import cli
sys.argv = ["agentrl", "schemas", "--help"]
try:
    cli.main()
except SystemExit:
    pass
print("threshold", gc.get_threshold()[0], file=sys.stderr)
"""


def test_the_agentrl_command_raises_it_before_its_command_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _MAIN], capture_output=True, text=True, timeout=120
    )
    assert f"threshold {YOUNG}" in proc.stderr, proc.stderr[-2000:]
