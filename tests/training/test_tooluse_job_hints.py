"""A dataset job of the tool-use loop (issue 52) through the real training service, a real
nats-server and the tiny model: with `hyperparameters.tooluse_hints` it hints the tasks
whose every logged attempt failed, a user's correction (on the reward's feedback) used as
the hint, trains on them, and reports the counts in its final status, where the loop sums
them (`loop_tooluse.job_counts`); with `tooluse_replay` it replays the verified success too."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from training_helpers import (
    Statuses,
    publish_raw,
    reward,
    running_service,
    settings_for,
    trajectory,
    tsettings,
)

from agentrl.bus import Bus
from agentrl.envs.tooluse.tasks import generate_task

FIX = "call the calculator with the whole expression, then answer"


def tooluse(i: int, seed: int, success: bool) -> dict[str, Any]:
    t = trajectory(i, task=f"tooluse-arithmetic/seed-{seed}", turns=2)
    t["task_context"].update(env_id="tooluse-arithmetic", seed=seed)
    t["turns"][0]["observation"]["content"] = generate_task(seed, "arithmetic").question
    t["metadata"]["outcome"] = {"task_status": "completed_successfully" if success else "failed"}
    return t


async def test_a_tooluse_job_hints_failed_tasks_with_the_users_correction(
    nats: Any, data_dir: Path
) -> None:
    bus = await Bus.connect(nats.url)
    await bus.ensure_streams()
    statuses = await Statuses().start(bus)
    # task 5: four failed attempts, one corrected by a user; task 6: one of four succeeded
    trajs = [tooluse(i, 5, False) for i in range(4)] + [tooluse(4 + i, 6, i == 0) for i in range(4)]
    rewards = [reward(t, 1.0 if i == 4 else 0.1 * (i % 3)) for i, t in enumerate(trajs)]
    rewards[1]["metadata"] = {"feedback": {"explicit": "thumbs_down", "correction": FIX}}
    await publish_raw(bus, "agent.rl.trajectory.v1", trajs, "trajectory_id")
    await publish_raw(bus, "agent.rl.reward.v1", rewards, "reward_id")
    ts = tsettings(
        threshold=8,
        sample_size=8,
        holdout_size=0.0,
        advantage_estimator="gigpo",
        hyperparameters={
            "objective": "pg",
            "tooluse_hints": {"mode": "distill", "max_new_tokens": 16, "max_steps": 2},
            "tooluse_replay": {"steps": 1, "episodes_per_family": 2},  # task 6's success
        },
    )
    try:
        async with running_service(bus, settings_for(data_dir, nats.url), ts) as svc:
            for _ in range(600):
                if svc.store.jobs():
                    break
                await asyncio.sleep(0.1)
            job = svc.store.jobs()[0].job_id
            final = await statuses.wait(job, ("completed", "failed"), 240)
    finally:
        await bus.close()
    assert final["status"] == "completed", final
    current = final["metrics"]["current"]
    assert current["hinted_tasks"] == 1 and current["corrections_used"] == 1
    assert current["hint_items"] == 4 * 2  # every turn of the four failed attempts
    from agentrl.app.loop_tooluse import job_counts
    from agentrl.contracts.training import TrainingStatus

    assert current["replay_successes"] == 1 and current["replayed"] > 0
    counts = job_counts({job: [TrainingStatus.model_validate(final)]})
    assert counts["hinted_tasks"] == 1 and counts["corrections_used"] == 1
    assert counts["replayed"] == current["replayed"]
    # where the job's seconds went: the replay and the hint items' training after the last
    # RL step are training, not the save (s31 read 39 s of them as "save")
    stages = final["metadata"]["stages_s"]
    assert {"hint_sampling", "rl", "replay", "hint_training", "save"} <= set(stages), stages
    trained = stages["rl"] + stages["replay"] + stages["hint_training"]
    assert abs(trained - final["resource_usage"]["train_step_seconds"]) < 0.05, (stages, final)
    assert stages["save"] > 0
