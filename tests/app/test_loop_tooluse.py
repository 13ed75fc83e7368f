"""`agentrl loop --env tooluse --quick` walks the chain with Agent Zero JSON replies under
structured outputs (tiny model): agents act through the gateway -> trajectories whose turns
name their completion-log rows -> task-completion rewards -> a job on the logged tokens ->
validation under the reply schema -> canary -> promotion; held-out tasks per family. The
last line is the loop's JSON with the tool-use keys."""

from __future__ import annotations

import json
from pathlib import Path

from loop_helpers import run_loop_cli


def test_tooluse_quick_loop_walks_the_chain(tmp_path: Path) -> None:
    proc = run_loop_cli("--env", "tooluse", "--quick", "--data-dir", str(tmp_path / "loop"))
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    last = json.loads(out.strip().splitlines()[-1])
    assert last["versions"] >= 2 and last["promoted"] >= 1, out[-3000:]
    assert last["trajectories"] > 0 and last["lost"] == 0
    assert last["heldout_seeds"] == 3 and last["start_model"] == "agentrl-policy-base"
    for key in ("start_heldout_success", "start_ci_high", "live_ci_low", "loop_wall_s"):
        assert last[key] is not None, key
    for fam in ("arithmetic", "data", "numbers"):
        assert f"live_{fam}_success" in last
    # issue 52: the unseen-phrasing pool apart, cut replies, hints, a generation's wall time
    assert last["unseen_seeds"] == 3
    for key in ("unseen_start_success", "unseen_live_success", "generation_wall_s_p50"):
        assert last[key] is not None, key
    cut = last["cut_by_token_cap"]
    assert cut["acting_replies"] > 0 and cut["heldout_replies"] > 0
    assert 0 <= cut["acting"] <= cut["acting_replies"]
    counts = ("hinted_tasks", "hinted_successes", "corrections_used", "replayed")
    assert all(last[k] >= 0 for k in counts)
    # the tiny random model fails every task: the jobs hint them (issue 52)
    assert last["hinted_tasks"] >= 1, out[-3000:]
    assert "held-out, unseen pool:" in out
    # per task, per version: a file each, and the start paired with the candidate (issue 52)
    files = sorted((tmp_path / "loop" / "heldout").glob("*.jsonl"))
    rows = {f.stem: [json.loads(x) for x in f.read_text().splitlines()] for f in files}
    assert last["start_model"] in rows and last["candidate_model"] in rows, sorted(rows)
    for lines in rows.values():
        assert sorted(r["pool"] for r in lines) == ["train"] * 3 + ["unseen"] * 3
        assert all(r["success"] or r["failure"] or r["error"] for r in lines)
    assert sum(r["replies"] for lines in rows.values() for r in lines) == cut["heldout_replies"]
    pair = last["paired_candidate_vs_start"]
    measured = [r for r in rows[last["start_model"]] if r["pool"] == "train" and not r["error"]]
    assert pair["tasks"] == len(measured) and pair["reference_ok"] == sum(
        r["success"] for r in measured
    )
    assert "unseen_paired_candidate_vs_start" in last
    assert set(last["first_tool_by_family"]) >= {"start", "candidate", "live"}
    assert "first tool:" in out and "paired, candidate vs start (held-out):" in out
    for stage in ("Agent Zero JSON", "training job", "completed", "validate", "-> canary",
                  "promote -> live", "per family:"):  # fmt: skip
        assert stage in out, f"no {stage!r} in the progress:\n{out[-3000:]}"
    assert "validation could not run" not in out


def test_tooluse_held_out_sets_are_large_distinct_and_balanced() -> None:
    from collections import Counter

    from agentrl.app.loop import LoopConfig
    from agentrl.app.loop_tooluse import heldout_tasks
    from agentrl.envs.tooluse.tasks import generate_task

    cfg = LoopConfig.tooluse()
    assert cfg.heldout_seeds >= 200 and cfg.unseen_seeds >= 60
    for n, pool in ((cfg.heldout_seeds, "train"), (cfg.unseen_seeds, "unseen")):
        tasks = heldout_tasks(n, 1_000_000, pool)
        assert len(tasks) == n and len(set(tasks)) == n
        per = Counter(f for f, _ in tasks)
        assert max(per.values()) - min(per.values()) <= 1
        assert len({generate_task(s, f, pool).question for f, s in tasks}) == n
    assert min(Counter(f for f, _ in heldout_tasks(cfg.heldout_seeds, 1_000_000)).values()) >= 60


def test_a_tooluse_job_reads_every_trajectory_of_the_run() -> None:
    # at 4-7 episodes a minute, the FrozenLake loop's 5-minute window held 11 of a job's 32
    from agentrl.app.loop import LoopConfig, loop_environment

    for cfg in (LoopConfig.tooluse(), LoopConfig.tooluse(time_budget_s=3600.0)):
        window = float(loop_environment(cfg)["AGENTRL_TRAINING_DATASET_WINDOW_S"])
        assert window >= cfg.time_budget_s + cfg.grace_s
    assert loop_environment(LoopConfig())["AGENTRL_TRAINING_DATASET_WINDOW_S"] == "300"


def tooluse_analysis(monkeypatch, cfg=None):  # type: ignore[no-untyped-def]
    """The canary analysis the tool-use loop's deployment service runs (its environment)."""
    from agentrl.app.loop import LoopConfig, loop_environment
    from agentrl.serving.config import DeploySettings

    for key, value in loop_environment(cfg or LoopConfig.tooluse()).items():
        monkeypatch.setenv(key, value)
    return DeploySettings().plan().analysis


def summary(means: list[float], requests: int = 200):  # type: ignore[no-untyped-def]
    """One version's canary evidence: the per-session mean rewards."""
    from agentrl.release.monitor import Summary

    return Summary(
        requests=requests,
        sessions=len(means),
        session_sum=sum(means),
        session_sumsq=sum(m * m for m in means),
    )


def test_the_tooluse_canary_judges_rewards_on_their_own_scale(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Task-completion rewards are 0 or 1: analysed on the deploy default's [-1, 1], a
    version that never succeeds against a live one at 0.85 was still undecided after 12
    sessions a side; on [0, 1] it fails, and two alike versions do not."""
    from agentrl.release.monitor import analyse

    analysis = tooluse_analysis(monkeypatch)
    assert analysis.reward_range == (0.0, 1.0)
    # sessions of 4 episodes
    live = summary([1.0, 0.75, 1.0, 0.5, 1.0, 0.75, 1.0, 1.0, 0.75, 1.0, 0.5, 1.0])
    assert analyse(summary([0.0] * 12), live, analysis)[0] == "fail"
    alike = summary([0.25, 0.5, 0.0, 0.75, 0.25, 0.5, 0.25, 0.0, 0.5, 0.25, 0.75, 0.25])
    assert analyse(alike, alike, analysis)[0] != "fail"


def test_the_tooluse_canary_decides_two_equal_versions_within_the_run(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A session is what the canary counts. Sessions of 4 episodes of one task have a mean
    of 0 or 1 by the task's family, so two equal versions stayed undecided; the loop's own
    sessions, at the families' measured success (arithmetic 0.85, data 0.03, numbers 0.12),
    pass within the 64 episodes a side a 20-minute run gives a canary."""
    import random

    from agentrl.app.loop import LoopConfig
    from agentrl.release.monitor import analyse

    cfg = LoopConfig.tooluse()
    analysis = tooluse_analysis(monkeypatch, cfg)
    rates, size = (0.85, 0.03, 0.12), cfg.group_size

    def version(rng: random.Random, episodes: int):  # type: ignore[no-untyped-def]
        means = []
        for _ in range(episodes // size):
            p = rng.choice(rates)  # one task per session
            means.append(sum(rng.random() < p for _ in range(size)) / size)
        return summary(means, requests=3 * episodes)

    verdicts = []
    for seed in range(100):
        rng = random.Random(seed)
        verdicts.append(analyse(version(rng, 64), version(rng, 64), analysis)[0])
    assert verdicts.count("fail") == 0
    assert verdicts.count("pass") >= 80, verdicts.count("pass")


def test_a_generations_wall_time_and_the_jobs_hint_counts() -> None:
    """Trigger (the job's first status) to promotion, per promoted version; the jobs' hint,
    correction and replay counts summed from their last status (0 where a job reports none)."""
    from datetime import UTC, datetime, timedelta

    from agentrl.app.loop_tooluse import generation_walls, job_counts
    from agentrl.contracts.training import TrainingStatus
    from agentrl.serving.registry import Decision, ModelRecord

    t0 = datetime(2026, 11, 29, 6, 0, tzinfo=UTC)

    def status(job: str, at: float, state: str, **metrics: int) -> TrainingStatus:
        return TrainingStatus(
            training_job_id=job,
            timestamp=t0 + timedelta(seconds=at),
            status=state,
            metrics={"current": metrics},
        )

    statuses = {
        "job-a": [status("job-a", 0, "queued"), status("job-a", 90, "completed", hinted_tasks=3,
                                                            hinted_successes=1, replayed=12)],
        "job-b": [status("job-b", 100, "queued"), status("job-b", 200, "completed")],
    }  # fmt: skip

    def record(version: int, job: str | None, promoted_at: float | None) -> ModelRecord:
        r = ModelRecord(model_id=f"v{version}", version=version, public_name="p",
                        base_model="tiny", training_job_id=job)  # fmt: skip
        if promoted_at is not None:
            r.decide(Decision(at=t0 + timedelta(seconds=promoted_at), by="t", action="promote",
                              reason="ok"))  # fmt: skip
        return r

    records = [record(1, None, 0), record(3, "job-b", None), record(2, "job-a", 480)]
    assert generation_walls(records, statuses) == [480.0]  # the start and v3: no promotion
    assert job_counts(statuses) == {"hinted_tasks": 3, "hinted_successes": 1,
                                    "corrections_used": 0, "replayed": 12}  # fmt: skip


def test_the_jobs_hint_counts_stop_at_the_last_decided_generation() -> None:
    """The loop's JSON counts the jobs up to the newest decided version's job (and the jobs
    started before it, ended ones too), not the jobs that went on after the decision."""
    from datetime import UTC, datetime, timedelta

    from agentrl.app.loop_tooluse import job_counts
    from agentrl.contracts.training import TrainingStatus
    from agentrl.serving.registry import ModelRecord

    t0 = datetime(2026, 11, 29, 6, 0, tzinfo=UTC)

    def status(job: str, at: float, state: str, hinted: int) -> TrainingStatus:
        return TrainingStatus(training_job_id=job, timestamp=t0 + timedelta(seconds=at),
                              status=state, metrics={"current": {"hinted_tasks": hinted}})  # fmt: skip

    statuses = {
        "job-a": [status("job-a", 0, "queued", 0), status("job-a", 90, "completed", 3)],
        "job-x": [status("job-x", 50, "queued", 0), status("job-x", 60, "cancelled", 2)],
        "job-b": [status("job-b", 100, "queued", 0), status("job-b", 200, "completed", 5)],
        "job-c": [status("job-c", 300, "queued", 0), status("job-c", 400, "completed", 7)],
    }

    def record(version: int, job: str, state: str) -> ModelRecord:
        return ModelRecord(model_id=f"v{version}", version=version, public_name="p",
                           base_model="tiny", training_job_id=job, state=state)  # fmt: skip

    records = [record(2, "job-a", "live"), record(3, "job-b", "rejected"),
               record(4, "job-c", "canary")]  # fmt: skip
    assert job_counts(statuses)["hinted_tasks"] == 17  # every job
    assert job_counts(statuses, records)["hinted_tasks"] == 10  # a, x, b: not c (undecided)
    records[2].state = "live"
    assert job_counts(statuses, records)["hinted_tasks"] == 17
    undecided = [record(2, "job-a", "candidate")]
    assert job_counts(statuses, undecided)["hinted_tasks"] == 0  # no generation decided


def test_the_tooluse_loop_benchmarks_its_start_version_while_the_agents_act(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """Its first candidate is then validated alone, not beside the warm start after its
    trigger (`Validator.start_reference`); the FrozenLake loop leaves it off."""
    from agentrl.app.loop import LoopConfig, loop_environment
    from agentrl.serving.config import DeploySettings

    monkeypatch.delenv("AGENTRL_DEPLOY_BENCHMARK_LIVE_EARLY", raising=False)
    assert DeploySettings().benchmark_live_early is False
    for key, value in loop_environment(LoopConfig()).items():
        monkeypatch.setenv(key, value)
    assert DeploySettings().benchmark_live_early is False
    for key, value in loop_environment(LoopConfig.tooluse()).items():
        monkeypatch.setenv(key, value)
    assert DeploySettings().benchmark_live_early is True
