"""The tool-use job harness (`python -m agentrl.bench.tooluse_job`): logged episodes survive
the disk, become the job's records with the reward service's partial credit and a
completion log of their exact tokens, and its `job` variant is what the loop gives its jobs."""

from __future__ import annotations

from pathlib import Path

from agentrl.bench.tooluse_job import (
    VARIANTS,
    load_episodes,
    loop_job_settings,
    records_of,
    save_episodes,
)
from agentrl.envs.tooluse.tasks import generate_task
from agentrl.learners.tooluse_episodes import EpisodeRecord, TurnRecord

SEED = 100_000


def turn(tool: str, text: str, result: str | None, answer: str | None = None) -> TurnRecord:
    return TurnRecord(
        prompt_ids=[1, 2, 3],
        action_ids=[4, 5, 6],
        logprobs=[-0.1, -0.2, -0.3],
        text=text,
        finish="stop",
        tool_name=tool,
        result=result,
        answer=answer,
    )


def episodes() -> list[EpisodeRecord]:
    task = generate_task(SEED, "arithmetic")
    right = str(task.answer)
    calc = turn("calculator", '{"tool_name": "calculator"}', f"calculator: = {right}")
    won = EpisodeRecord(
        "arithmetic", SEED, task.question, [calc, turn("response", "{}", None, right)]
    )
    won.success = won.answered = True
    lost = EpisodeRecord(
        "arithmetic", SEED, task.question, [calc, turn("response", "{}", None, "7")]
    )
    lost.answered = True
    return [won, lost]  # fmt: skip


def test_episodes_round_trip_and_score_as_the_loop_scores_them(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    save_episodes(path, episodes())
    again = load_episodes(path)
    assert [e.turns[1].answer for e in again] == [e.turns[1].answer for e in episodes()]
    records, completions = records_of(again, "h-1")
    won, lost = records
    assert won.score == 1.0
    # the failure: a valid call that ran and showed a needed value, and an answer given
    assert 0.0 < lost.score < 0.5
    assert lost.turn_rewards is not None and abs(sum(lost.turn_rewards) - lost.score) < 1e-6
    assert lost.turn_rewards[0] > lost.turn_rewards[1] > 0  # the call earned the most
    assert won.task_id == lost.task_id  # one GiGPO group
    row = completions[lost.trajectory["turns"][0]["action"]["completion_id"]]
    assert row["completion_token_ids"] == [4, 5, 6] and row["schema_hash"] == "h-1"
    plain, _ = records_of(again, "h-1", partial_credit=False)
    assert [r.score for r in plain] == [1.0, 0.0]


def test_the_job_variant_is_the_loops_job() -> None:
    job = loop_job_settings()
    assert VARIANTS["job"] == {}
    assert job["estimator"] == "gigpo" and job["advantage_scale"] == "none"
    assert VARIANTS["old"]["advantage_scale"] == "std" and VARIANTS["old"]["all_layers"]


def test_agentrl_bench_passes_every_argument_to_the_harness() -> None:
    """`agentrl bench tooluse-job` is the harness's own command line: `--help` shows its
    options, and a missing required one is its error, not typer's."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    runner = CliRunner()
    shown = runner.invoke(app, ["bench", "tooluse-job", "--help"])
    assert shown.exit_code == 0, shown.output
    assert "--start" in shown.output and "--variant" in shown.output
    assert "fixed harness" in runner.invoke(app, ["bench", "--help"]).output
    missing = runner.invoke(app, ["bench", "tooluse-job", "--out", "x"])
    assert missing.exit_code == 2 and "--start" in missing.output


def test_hint_variants_run_the_loops_hint_step_on_one_shared_rl_update() -> None:
    """The hint variants use the loop's hint settings (`loop_tooluse.job_hints`) with the
    harness's task and resample counts, and share the `job` variant's RL update (one saved
    update per RL settings: a different learning rate is another one)."""
    from agentrl.bench.tooluse_job import Settings, hint_settings, rl_key

    s = Settings("start", "out", hint_tasks=12, hint_samples=2)
    for name, mode in (
        ("hint-importance", "importance"),
        ("hint-sft", "sft"),
        ("hint-distill", "distill"),
    ):
        assert VARIANTS[name]["hints"] == mode
        hs = hint_settings(s, mode)
        assert (hs.mode, hs.max_tasks, hs.samples) == (mode, 12, 2)
        assert hs.plan and not hs.reveal_answer  # the loop's hint: the plan, never the answer
    base = {**loop_job_settings(), "partial_credit": True, "all_layers": False}
    assert rl_key({**base, **VARIANTS["hint-sft"]}) == rl_key({**base, **VARIANTS["job"]})
    assert rl_key({**base, **VARIANTS["lr1e-4"]}) != rl_key(base)
    assert VARIANTS["sft-only"]["rl"] is False
