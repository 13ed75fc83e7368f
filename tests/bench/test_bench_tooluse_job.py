"""The tool-use job harness (`python -m agentrl.bench.tooluse_job`): logged episodes survive
the disk, become the job's records with the reward service's partial credit and a
completion log of their exact tokens, and its `job` variant is what the loop gives its jobs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

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


def test_the_hint_volume_reaches_the_harness_from_its_command_line(tmp_path: Path) -> None:
    """--hint-extra-families and --hint-extra-group set which families' extra tasks feed
    the hint step and how often each is played; a family that does not exist is the
    parser's error, not a run that silently hints nothing."""
    import pytest

    from agentrl.bench.tooluse_job import parser, settings_of

    p = parser()
    base = ["--start", "s", "--out", str(tmp_path)]
    s = settings_of(p, p.parse_args(base))
    assert (s.hint_extra_families, s.hint_extra_group) == (("data",), 2)
    argv = [*base, "--hint-extra-per-family", "30", "--hint-extra-families", "data, numbers"]
    s = settings_of(p, p.parse_args([*argv, "--hint-extra-group", "1", "--hint-tasks", "90"]))
    assert s.hint_extra_families == ("data", "numbers")
    assert (s.hint_extra_per_family, s.hint_extra_group, s.hint_tasks) == (30, 1, 90)
    with pytest.raises(SystemExit) as bad:
        settings_of(p, p.parse_args([*base, "--hint-extra-families", "data,tables"]))
    assert bad.value.code == 2


def test_extra_plays_of_another_volume_are_never_reused(tmp_path: Path) -> None:
    """The extra hint-free plays are saved with the volume that made them: a run asking for
    another volume in the same folder stops with a clear error instead of hinting the old
    plays; the same volume reuses them."""
    import json

    import pytest

    from agentrl.bench.tooluse_job import Settings, extra_hint_episodes

    save_episodes(tmp_path / "extra_episodes.jsonl", episodes())
    meta = {"per_family": 8, "families": ["data"], "group": 2}
    (tmp_path / "extra_episodes.json").write_text(json.dumps(meta))
    same = Settings("s", str(tmp_path), hint_extra_per_family=8)
    assert len(extra_hint_episodes(None, same, episodes()[:1])) == 3
    other = Settings(
        "s", str(tmp_path), hint_extra_per_family=30, hint_extra_families=("data", "numbers")
    )
    with pytest.raises(SystemExit, match="another --out"):
        extra_hint_episodes(None, other, [])


def lost(family: str, seed: int, hint: str | None = None) -> EpisodeRecord:
    """A failed hint-free (or, with `hint`, hinted) attempt of a training task."""
    task = generate_task(seed, family)
    calc = turn("calculator", '{"tool_name": "calculator"}', "calculator: = 7")
    ep = EpisodeRecord(family, seed, task.question, [calc, turn("response", "{}", None, "7")])
    ep.answered, ep.hint = True, hint
    return ep


def test_a_new_familys_extra_plays_and_hints_are_played_beside_the_saved_ones(
    tmp_path: Path,
) -> None:
    """Adding a family to --hint-extra-families in a folder that holds another family's
    extra plays and hinted resamples plays the new family's tasks and hints its failures
    only (a real tiny policy plays them), saves them beside the old ones, and a later run
    plays nothing; another count or group, or a saved family no longer asked for, is still
    the clear error."""
    import json

    import pytest

    from agentrl.bench.tooluse_job import Settings, extra_hint_episodes, hinted_resamples
    from agentrl.learners.tooluse import RL_SEED_BASE
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.trainer import PolicyTrainer

    seed = RL_SEED_BASE + 8_000
    save_episodes(tmp_path / "extra_episodes.jsonl", [lost("data", seed)])
    meta = {"per_family": 1, "families": ["data"], "group": 1}
    (tmp_path / "extra_episodes.json").write_text(json.dumps(meta))
    s = Settings(
        "s",
        str(tmp_path),
        max_steps=2,
        max_new_tokens=12,
        hint_tasks=4,
        hint_samples=1,
        hint_extra_per_family=1,
        hint_extra_families=("data", "arithmetic"),
        hint_extra_group=1,
    )
    trainer = PolicyTrainer.from_config(
        TrainerConfig(model="tiny", seed=0, learning_rate=1e-2, storage_path=str(tmp_path)), None
    )
    more = extra_hint_episodes(trainer, s, episodes()[:1])
    assert [(e.family, e.seed, e.hint) for e in more[1:]] == [
        ("data", seed, None),
        ("arithmetic", seed, None),
    ]
    assert more[1].question == generate_task(seed, "data").question  # the saved play, kept
    saved = json.loads((tmp_path / "extra_episodes.json").read_text())
    assert saved == {**meta, "families": ["data", "arithmetic"]}
    again = extra_hint_episodes(None, s, [])  # no policy: nothing may be played
    assert [(e.family, e.seed) for e in again] == [("data", seed), ("arithmetic", seed)]
    for bad in (
        dataclasses.replace(s, hint_extra_per_family=2),
        dataclasses.replace(s, hint_extra_group=2),
        dataclasses.replace(s, hint_extra_families=("arithmetic",)),
    ):
        with pytest.raises(SystemExit, match="another --out"):
            extra_hint_episodes(None, bad, [])

    save_episodes(tmp_path / "hinted.jsonl", [lost("data", seed, hint="Hint: h")])
    recs, comps = records_of([lost("data", seed), lost("arithmetic", seed)], "h-1")
    hinted = hinted_resamples(trainer, s, recs, comps)
    assert [(e.family, e.seed) for e in hinted] == [("data", seed), ("arithmetic", seed)]
    assert hinted[0].hint == "Hint: h" and hinted[1].hint and "Hint:" in hinted[1].hint
    assert len(load_episodes(tmp_path / "hinted.jsonl")) == 2
    assert len(hinted_resamples(None, s, recs, comps)) == 2  # all saved: nothing played


def test_expert_iteration_variants_hint_again_after_training() -> None:
    from agentrl.bench.tooluse_job import rl_key

    assert VARIANTS["sft-only-r2"] == {"hints": "sft", "rl": False, "hint_rounds": 2}
    base = {**loop_job_settings(), "partial_credit": True, "all_layers": False}
    # hint-sft-r2 shares the job's RL update; only its hint step runs twice
    assert rl_key({**base, **VARIANTS["hint-sft-r2"]}) == rl_key({**base, **VARIANTS["job"]})


def test_a_hint_round_is_played_by_the_updated_model_once_and_reused(tmp_path: Path) -> None:
    """Round 2 of expert iteration hints the failed task again with the model as it is now
    (a real tiny policy plays it), saves those resamples per variant and round, and a
    later run reuses them; its record counts hinted successes per family."""
    from agentrl.bench.tooluse_job import Settings, _hint_round, _round_record
    from agentrl.learners.tooluse_job import JobHints
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.trainer import PolicyTrainer

    trainer = PolicyTrainer.from_config(
        TrainerConfig(model="tiny", seed=0, learning_rate=1e-2, storage_path=str(tmp_path)), None
    )
    recs, comps = records_of(episodes()[1:], "h-1")  # the lost attempt alone: a failed task
    hs = JobHints(mode="sft", samples=2, max_tasks=1, max_new_tokens=12, max_steps=2)
    settings = Settings("s", str(tmp_path))
    step = _hint_round(trainer, hs, settings, tmp_path, "sft-only-r2", 2, recs, comps)
    saved = tmp_path / "hinted-sft-only-r2-r2.jsonl"
    assert saved.exists() and step.counts["hinted_samples"] == 2
    assert all(ep.hint and ep.family == "arithmetic" for ep in step.episodes)
    won = load_episodes(saved)
    for ep in won:  # a later run finds these: it must not play again
        ep.success = True
    save_episodes(saved, won)
    again = _hint_round(trainer, hs, settings, tmp_path, "sft-only-r2", 2, recs, comps)
    assert again.counts["hinted_successes"] == 2
    rec = _round_record(again, {"tokens": 40, "loss": 0.5})
    assert rec["hinted_by_family"] == {"arithmetic": "2/2"} and rec["tokens"] == 40
    assert rec["hinted_tasks"] == 1


def test_replay_variants_train_the_jobs_replay_beside_checked_hint_items(tmp_path: Path) -> None:
    """`replay-*` variants build the job's replay from the logged episodes' verified
    successes and the warm start's scripted episodes; a checked variant's length check
    bounds a hinted reply by its family's longest verified one (the replay's), counts the
    replay's draw in the family cap, and its record says what the replay held."""
    from agentrl.bench.tooluse_job import (
        FAMILY_SHARE,
        REPLAY,
        Settings,
        _hint_step,
        _replay_record,
        _round_record,
        _variant_settings,
        job_replay,
        replay_bounds,
        replay_items_per_pass,
    )
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.trainer import PolicyTrainer

    assert VARIANTS["replay-sft"] == {"hints": "sft", "rl": False, "replay": True, "checked": True}
    assert "checked" not in VARIANTS["replay-sft-unchecked"] and FAMILY_SHARE == 0.5
    trainer = PolicyTrainer.from_config(
        TrainerConfig(model="tiny", seed=0, learning_rate=1e-2, storage_path=str(tmp_path)), None
    )
    replay = job_replay(trainer, *records_of(episodes(), "h-1"), 0)
    assert replay.counts["replay_successes"] == 1  # the won attempt; the lost one is not
    assert replay.counts["replay_warm"] == 3 * REPLAY["warm_tasks_per_family"]
    bounds = replay_bounds(replay)
    assert (
        set(bounds) == {"arithmetic", "data", "numbers"} and bounds["data"] > bounds["arithmetic"]
    )
    per_pass = replay_items_per_pass(replay)
    draws = REPLAY["steps"] * REPLAY["episodes_per_family"]
    assert all(draws <= n <= 3 * draws for n in per_pass.values())  # 1-3 replies an episode
    # the hinted resamples a run saved: one with a reply longer than arithmetic's bound
    task = generate_task(SEED, "arithmetic")
    wins = []
    for n in (bounds["arithmetic"] + 1, 4):
        t = turn("response", "{}", None, str(task.answer))
        t.action_ids, t.logprobs, t.free_prompt_ids = [4] * n, [-0.1] * n, [1, 2]
        won = EpisodeRecord("arithmetic", SEED, task.question, [t], hint="Hint: h")
        won.success = won.answered = True
        wins.append(won)
    save_episodes(tmp_path / "hinted.jsonl", wins)
    recs, comps = records_of(episodes()[1:], "h-1")  # the lost attempt: a failed task
    s = Settings("s", str(tmp_path), hint_tasks=1, hint_samples=2)
    v = _variant_settings("replay-sft")
    step, hs, _ = _hint_step(trainer, v, s, episodes()[1:], recs, comps, "h-1", replay)
    assert hs.family_bound and hs.max_family_share == FAMILY_SHARE and hs.mode == "sft"
    assert step.counts["hinted_successes"] == 2 and step.counts["hint_too_long"] == 1
    assert step.counts["hint_capped"] == 0  # one arithmetic item beside the replay's draw
    assert [len(it.action_ids) for it in step.items] == [4]
    rr = _round_record(step, {"tokens": 4, "loss": 0.1})  # the record's per-family counts
    assert rr["hint_items_by_family"] == step.by_family
    assert step.by_family == {
        "arithmetic": {
            "successes": 2, "too_long": 1, "capped": 0, "items": 1, "response": 1,
            "solver_thought": 0,
        }
    }  # fmt: skip
    unchecked = _variant_settings("replay-sft-unchecked")
    loose, _, _ = _hint_step(trainer, unchecked, s, episodes()[1:], recs, comps, "h-1", replay)
    assert loose.counts["hint_too_long"] == 0 and len(loose.items) == 2
    # the relabel variant: the same checked sft step, with the solver's thoughts
    assert VARIANTS["replay-sft-relabel"] == {**VARIANTS["replay-sft"], "relabel": True}
    assert VARIANTS["sft-relabel"] == {**VARIANTS["sft-only"], "relabel": True}
    relabel = _variant_settings("replay-sft-relabel")
    rel, rhs, _ = _hint_step(trainer, relabel, s, episodes()[1:], recs, comps, "h-1", replay)
    assert rhs.relabel_thoughts and not hs.relabel_thoughts
    assert rel.counts["hint_relabelled"] == 0  # the saved wins' replies ("{}") have no thought
    assert [len(it.action_ids) for it in rel.items] == [4]
    rec = _replay_record(replay)
    assert rec["replay_bounds"] == bounds and rec["replay_by_family"]["arithmetic"] == 5
    # the retry variant: the best variant's settings with the replay's retries on
    assert VARIANTS["replay-retry-importance"] == {**VARIANTS["replay-importance"], "retries": True}
    assert not replay.settings.retries and rec["replay_retries"] == 0
    with_retries = job_replay(trainer, *records_of(episodes(), "h-1"), 0, retries=True)
    assert with_retries.settings.retries
    # the tool-balanced variants: the same replay, each pass balanced per opening tool
    assert VARIANTS["replay-tool-balanced"] == {**VARIANTS["replay-only"], "balance_openings": True}
    assert VARIANTS["replay-sft-relabel-tool-balanced"] == {
        **VARIANTS["replay-sft-relabel"],
        "balance_openings": True,
    }
    assert not replay.settings.balance_openings
    balanced = job_replay(trainer, *records_of(episodes(), "h-1"), 0, balance_openings=True)
    held = balanced.replay.openings()
    assert held["calculator"] >= 1 and held["code_exe"] >= 2  # the warm start's, at least
    balanced.draw(balanced.generator)
    trained = _replay_record(balanced)["replay_openings_trained"]
    assert trained["calculator"] == trained["code_exe"] >= 2 * REPLAY["episodes_per_family"]


def test_a_turn_rebuilt_from_the_trajectory_is_the_prompt_it_was_sampled_from(
    tmp_path: Path,
) -> None:
    """The job's records show a tool's result as Agent Zero's message (the env's
    `agent_zero` view), so every turn's prompt rebuilt from the trajectory (the replay's
    and distillation's `turn_messages`) is the exact prompt the policy sampled that turn
    from: episodes played by a real tiny policy, turns after a tool call among them."""
    from agentrl.bench.tooluse_job import Settings, play, trajectory_of
    from agentrl.learners.tooluse_job import turn_messages
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.samples import render_prompt
    from agentrl.llm.trainer import PolicyTrainer

    trainer = PolicyTrainer.from_config(
        TrainerConfig(model="tiny", seed=0, learning_rate=1e-2, storage_path=str(tmp_path)), None
    )
    s = Settings("s", str(tmp_path), max_steps=3, max_new_tokens=16)
    tasks = [("arithmetic", SEED), ("data", SEED), ("numbers", SEED)]
    played = play(trainer, s, tasks, 1.0)
    tok = trainer.policy.tokenizer
    later = 0
    for ep in played:
        traj = trajectory_of(ep, "t", None)
        for k, t in enumerate(ep.turns):
            rebuilt = render_prompt(tok, turn_messages(traj, ep.question, k))
            assert rebuilt == list(t.prompt_ids), (ep.family, k)
            later += k > 0
    assert later >= 2  # turns after a tool's (or an error's) message were compared


def test_a_shown_form_variant_tells_its_hints_and_replay_and_the_after_stage_waits(
    tmp_path: Path, smol_tokenizer: Any
) -> None:
    """`replay-sft-balanced-shown` (issue 52, s33): its hints' calls and its replay's scripted
    data episodes are written in the solver's "shown" form, its control's in the default
    one; `--stage after` waits for the held-out before another process saves whole."""
    import threading

    from agentrl.bench.tooluse_job import (
        Settings,
        hint_settings,
        parser,
        save_atomically,
        wait_for_episodes,
    )
    from agentrl.learners.tooluse_job_replay import JobReplaySettings, replay_of_records

    shown, control = VARIANTS["replay-sft-balanced-shown"], VARIANTS["replay-sft-balanced"]
    assert {k: v for k, v in shown.items() if k != "data_program"} == control
    s = Settings("start", str(tmp_path))
    assert hint_settings(s, "sft", shown["data_program"]).data_program == "shown"
    assert hint_settings(s, "sft").data_program is None
    job = replay_of_records(
        smol_tokenizer, [], JobReplaySettings(warm_tasks_per_family=1, data_program="shown")
    )
    (data,) = job.replay.held("data")
    assert "C=[" in smol_tokenizer.decode(data[0].action_ids)
    assert parser().parse_args(["--start", "s", "--out", "o", "--stage", "after"]).stage == "after"
    path = tmp_path / "heldout_before.jsonl"
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.extend(wait_for_episodes(path, print, 0.05)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got  # nothing there yet: still waiting
    save_atomically(path, episodes())
    waiter.join(5)
    assert not waiter.is_alive() and [e.seed for e in got] == [e.seed for e in episodes()]
