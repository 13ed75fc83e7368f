"""A supervisor that was SIGKILLed cannot end its vLLM: the engine core and worker go on
(measured: a worker at 100 % of a core and 2.8 GB after `kill -9` of the loop, halving the
next run). The next supervisor ends the group its predecessor recorded, and only a group
that runs vLLM. Stand-ins: real process groups of sleeping Pythons whose command line does
or does not name vLLM (a real `vllm serve` is tests/serving/test_vllm.py's)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.serving.vllm.server import VllmServer, group_members, reap_stale_group

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

# a leader that starts a child in its own group, then both sleep (as the API server, its
# engine core and worker do)
LEADER = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]]); "
    "time.sleep(300)"
)


def group(tag: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", LEADER, tag], start_new_session=True)
    deadline = time.monotonic() + 20
    while len(group_members(proc.pid)) < 2:
        assert time.monotonic() < deadline, "the stand-in's child did not start"
        time.sleep(0.05)
    return proc


def end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    proc.wait(5)


def test_a_left_vllm_group_is_ended_and_anything_else_left_alone(tmp_path: Path) -> None:
    stale = group("vllm-engine-core-stand-in")
    other = group("not-an-inference-server")
    try:
        leader_gone = stale.pid
        pgid_file = tmp_path / "vllm.pgid"
        pgid_file.write_text(str(leader_gone))
        os.kill(stale.pid, 9)  # the API server dies first, its children stay
        stale.wait(5)
        assert len(group_members(leader_gone)) == 1  # the orphan, still in the group
        ended = reap_stale_group(pgid_file, wait_s=5)
        assert len(ended) == 1 and "vllm" in next(iter(ended.values()))
        assert group_members(leader_gone) == {} and not pgid_file.exists()

        pgid_file.write_text(str(other.pid))  # a recycled number: not vLLM
        assert reap_stale_group(pgid_file) == {}
        assert len(group_members(other.pid)) == 2 and not pgid_file.exists()

        live_owned = group("vllm-of-a-running-supervisor")
        try:  # its owner (here: `other`'s leader, alive) still runs: not stale
            pgid_file.write_text(f"{live_owned.pid} {other.pid}")
            assert reap_stale_group(pgid_file) == {}
            assert len(group_members(live_owned.pid)) == 2
            pgid_file.write_text(f"{live_owned.pid} {leader_gone}")  # owner gone: stale
            assert len(reap_stale_group(pgid_file, wait_s=5)) == 2
            assert group_members(live_owned.pid) == {}
        finally:
            end(live_owned)
        pgid_file.write_text("not a number")
        assert reap_stale_group(pgid_file) == {}
    finally:
        end(stale)
        end(other)


async def test_the_supervisor_ends_its_predecessors_group_before_it_starts(
    tmp_path: Path,
) -> None:
    stale = group("vllm-stand-in")
    log_path = tmp_path / "vllm.log"
    server = VllmServer(tmp_path / "absent" / "python", "m", log_path=log_path)
    try:
        assert server.pgid_path == tmp_path / "vllm.pgid"
        server.pgid_path.write_text(str(stale.pid))
        server.start()
        deadline = time.monotonic() + 20
        while group_members(stale.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert group_members(stale.pid) == {}
        while server.last_error is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert "could not start" in (server.last_error or "")  # then it went on as usual
    finally:
        await server.close()
        end(stale)
