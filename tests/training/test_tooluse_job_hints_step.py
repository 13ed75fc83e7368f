"""A loop job's hint step on its own (issue 52), with the tiny model and hand-made logged
trajectories: which failed tasks a job hints (the families in turn), and, with
`fallback_distill`, a task whose hinted resamples all failed is distilled on its own failed
attempts instead of training nothing, with no hint in any trained prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training_helpers import trajectory

from agentrl.envs.tooluse.tasks import generate_task
from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner
from agentrl.learners.tooluse_episodes import PlayTiming
from agentrl.learners.tooluse_job import hint_step, pick_tasks
from agentrl.training.dataset import Record


def logged(i: int, family: str, seed: int) -> Record:
    """A failed two-turn attempt at a tool-use task, as the loop logs it."""
    t = trajectory(i, task=f"tooluse-{family}/seed-{seed}", turns=2)
    t["task_context"].update(env_id=f"tooluse-{family}", seed=seed)
    t["turns"][0]["observation"]["content"] = generate_task(seed, family).question
    t["metadata"]["outcome"] = {"task_status": "failed"}
    return Record(t, {"reward": 0.0})


def test_a_job_hints_the_families_in_turn() -> None:
    groups: dict[tuple[str, int], list[Any]] = {("arithmetic", s): [] for s in range(6)}
    groups.update({("data", 10): [], ("numbers", 20): [], ("numbers", 21): []})
    assert pick_tasks(groups, 4) == [("arithmetic", 0), ("data", 10), ("numbers", 20),
                                     ("arithmetic", 1)]  # fmt: skip
    assert len(pick_tasks(groups, 50)) == 9
    mixed = {("mixed", s): [] for s in range(30)}  # a mixed task's family is its seed's
    fams = [generate_task(s, "mixed").family for _, s in pick_tasks(mixed, 3)]
    assert sorted(fams) == ["arithmetic", "data", "numbers"]


def test_a_task_no_hinted_resample_solved_is_distilled_not_dropped(tmp_path: Path) -> None:
    learner = ToolUseLearner(ToolUseConfig(
        model="tiny", max_steps=2, max_new_tokens=8, threads=0, warm_start=False,
        heldout_per_family=1, unseen_per_family=0, out_dir=str(tmp_path / "run"),
    ))  # fmt: skip
    tok = learner.tokenizer
    records = [logged(i, "data", 7) for i in range(2)] + [logged(2, "numbers", 9)]
    settings = {"mode": "importance", "samples": 1, "max_new_tokens": 8, "max_steps": 2,
                "fallback_distill": True}  # fmt: skip
    timing = PlayTiming()  # a job counts the sampling's decode steps as its liveness
    step = hint_step(learner.trainer, records, settings, timing=timing)
    assert timing.stats.decode_steps > 0
    # the tiny random model solves nothing, hinted or not
    assert step.counts["hinted_tasks"] == 2 and step.counts["hinted_successes"] == 0
    assert step.counts["distilled_tasks"] == 2
    assert len(step.items) == 3 * 2  # every turn of the three failed attempts
    assert all(it.mode == "distill" for it in step.items)
    for it in step.items:  # the hint is the teacher's context only
        assert "Hint: " not in tok.decode(it.prompt_ids)
        assert "Hint: " in tok.decode(it.hinted_prompt_ids or [])
    assert {it.family for it in step.items} == {"data", "numbers"}
