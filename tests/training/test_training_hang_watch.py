"""The training service's hang watch: a job silent for `hang_timeout_s` is killed as hung.
A heartbeat says only that the process lives (its thread goes on in a hung job); a heartbeat
whose work count moved (optimiser or decode steps, `Emitter.count_work`) is progress. s33's
tool-use job was killed after 900 s of hint sampling at load 13: that stage reported nothing.
A real job process stand-in (`sleep`), the real heartbeat thread, the service's own poll."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

from training_helpers import tsettings

from agentrl.core.settings import Settings
from agentrl.training.progress import Emitter
from agentrl.training.service import RunningJob, TrainingService
from agentrl.training.store import JobRow

HANG_S = 1.0


async def _watch(tmp_path: Path, probe: Any, seconds: float) -> RunningJob:
    """Poll a live process whose heartbeats carry `probe`'s count for `seconds`."""
    service = TrainingService(
        None,  # type: ignore[arg-type]  # the poll of a job that sends no progress needs no bus
        Settings(data_dir=tmp_path / "data"),
        tsettings(hang_timeout_s=HANG_S),
    )
    job_dir = tmp_path / "job"
    job_dir.mkdir(parents=True)
    emitter = Emitter(job_dir / "events.jsonl")
    if probe is not None:
        emitter.count_work(probe)
    stop = emitter.heartbeat(0.1)
    proc = await asyncio.create_subprocess_exec("sleep", "60")
    row = JobRow("j1", 1, 0, "running", "dataset", {}, 0.0, 0.0, None, proc.pid, None, 0, None)
    job = RunningJob(row, proc, job_dir)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end and proc.returncode is None:
            await service._poll(job)
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    return job


async def test_heartbeats_whose_work_moves_keep_a_long_stage_alive(tmp_path: Path) -> None:
    count = itertools.count()
    job = await _watch(tmp_path, lambda: next(count), 3 * HANG_S)
    assert job.final is None  # alive past three hang timeouts: never killed
    assert job.work > 0


async def test_heartbeats_alone_are_not_progress(tmp_path: Path) -> None:
    for probe in (None, lambda: 7):  # no work counted; a count that never moves
        job = await _watch(tmp_path / str(probe is None), probe, 3 * HANG_S)
        assert job.final is not None and job.final["code"] == "INFRA"
        assert "no progress" in job.final["message"]
