"""The job launcher (agentrl.training.launcher) with stand-in jobs: a forked job gets the
order's environment, directory and log in a session of its own, and its exit code or
signal comes back; SIGTERM reaches it; it dies with the runner that ordered it and with the
launcher; a bad order gets an error and the launcher goes on; an unreachable launcher is an
OSError (the service then starts the job's process itself)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agentrl.training.launcher import launch

CHILD = Path(__file__).with_name("_launcher_child.py")


@pytest.fixture()
def launcher(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    path = Path(f"/tmp/agentrl-lt-{os.getpid()}-{time.monotonic_ns()}.sock")
    proc = subprocess.Popen([sys.executable, str(CHILD), str(path)], start_new_session=True)
    end = time.monotonic() + 30
    while not path.exists():  # bound before any import
        assert time.monotonic() < end and proc.poll() is None, "the launcher did not start"
        time.sleep(0.02)
    try:
        yield path, proc
    finally:
        proc.terminate()
        proc.wait(10)
        path.unlink(missing_ok=True)


def _job(tmp_path: Path, name: str, sleep: float = 0.0, code: int = 0) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "sleep").write_text(str(sleep))
    (d / "code").write_text(str(code))
    return d


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def _until(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_a_forked_job_runs_with_the_orders_env_dir_and_log(launcher, tmp_path, monkeypatch):
    path, proc = launcher
    job_dir = _job(tmp_path, "a", code=3)
    monkeypatch.chdir(tmp_path)
    job = await launch(path, job_dir, {**os.environ, "JOB_MARK": "m1", "OMP_NUM_THREADS": "1"})
    assert await job.wait() == 3
    text = (job_dir / "process.log").read_text()
    assert f"env m1 cwd {tmp_path} sid {job.pid}" in text  # its own session
    # a launcher that preloaded nothing leaves torch to the job (its threads: the job's env)
    assert "torch imported: False" in text
    # the next one forks from the same launcher, which keeps no state of the first
    second = _job(tmp_path, "b")
    job2 = await launch(path, second, {**os.environ, "JOB_MARK": "m2"})
    assert await job2.wait() == 0 and job2.pid != job.pid
    assert "env m2" in (second / "process.log").read_text()
    assert proc.poll() is None


async def test_sigterm_reaches_the_job_and_its_signal_comes_back(launcher, tmp_path):
    path, _proc = launcher
    job = await launch(path, _job(tmp_path, "a", sleep=60), dict(os.environ))
    assert job.returncode is None and _alive(job.pid)
    job.terminate()
    assert await asyncio.wait_for(job.wait(), 10) == -signal.SIGTERM
    job.kill()  # after its exit: nothing is signalled


async def test_a_job_dies_with_the_runner_that_ordered_it(launcher, tmp_path):
    path, proc = launcher
    runner = subprocess.Popen(
        [sys.executable, str(CHILD), "order", str(path), str(_job(tmp_path, "a", sleep=60))],
        stdout=subprocess.PIPE,
    )
    assert runner.stdout is not None
    pid = int(runner.stdout.readline())
    assert _alive(pid)
    runner.kill()
    runner.wait()
    await _until(lambda: not _alive(pid))
    assert proc.poll() is None  # the launcher goes on: another job runs
    job = await launch(path, _job(tmp_path, "b"), dict(os.environ))
    assert await job.wait() == 0


async def test_a_job_dies_with_its_launcher_and_says_killed(launcher, tmp_path):
    path, proc = launcher
    job = await launch(path, _job(tmp_path, "a", sleep=60), dict(os.environ))
    proc.kill()
    assert await asyncio.wait_for(job.wait(), 10) == -signal.SIGKILL
    await _until(lambda: not _alive(job.pid))


async def test_a_bad_order_is_refused_and_the_launcher_goes_on(launcher, tmp_path):
    path, proc = launcher
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(b'{"no job_dir": 1}\n')
    await writer.drain()
    assert b"bad order" in await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    job = await launch(path, _job(tmp_path, "a"), dict(os.environ))
    assert await job.wait() == 0 and proc.poll() is None


async def test_an_unreachable_launcher_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        await launch(tmp_path / "none.sock", tmp_path, {})
