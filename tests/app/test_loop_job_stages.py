"""The loop's stage line splits a job's time as the job reported it (`stages_s` in its
completed status's metadata), so a replay round or the hint items' training is never read
as the save (s31 read 39 s of training after the last RL report as "save 39")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agentrl.app.loop_agents import Watch
from agentrl.app.loop_results import job_stages
from agentrl.contracts.training import TrainingStatus


def _status(
    job: str, status: str, at: float, stages: dict[str, float] | None = None
) -> TrainingStatus:
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    meta: dict[str, object] = {"training_platform": "agentrl-training-v1"}
    if stages is not None:
        meta["stages_s"] = stages
    return TrainingStatus.model_validate(
        {
            "training_job_id": job,
            "timestamp": (t0 + timedelta(seconds=at)).isoformat(),
            "status": status,
            "metadata": meta,
        }
    )


async def test_the_stage_line_has_each_part_of_a_job_averaged_over_the_jobs() -> None:
    watch = Watch()
    a, b = "00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"
    await watch.on_status(_status(a, "running", 0))
    await watch.on_status(
        _status(a, "completed", 300, {"hint_sampling": 80, "rl": 150, "replay": 30, "save": 0.4})
    )
    await watch.on_status(_status(b, "running", 0))
    await watch.on_status(
        _status(b, "completed", 100, {"hint_sampling": 20, "rl": 50, "replay": 10, "save": 0.2})
    )
    stages: dict[str, float] = {}
    job_stages(watch, stages)
    assert stages["training_jobs"] == 2 and stages["training_per_job"] == 200
    assert stages["job_hint_sampling"] == 50 and stages["job_rl"] == 100
    assert stages["job_replay"] == 20 and abs(stages["job_save"] - 0.3) < 1e-9
    assert "job_hint_training" not in stages  # neither job reported it


async def test_a_job_that_reported_no_parts_adds_none() -> None:
    watch = Watch()
    a = "00000000-0000-0000-0000-00000000000a"
    await watch.on_status(_status(a, "running", 0))
    await watch.on_status(_status(a, "completed", 60))
    stages: dict[str, float] = {}
    job_stages(watch, stages)
    assert stages["training_per_job"] == 60
    assert not [k for k in stages if k.startswith("job_")]
