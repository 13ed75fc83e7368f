"""The loop's tool-use jobs replay verified successes (issue 52, item 4): a job keeps the
tool-use trajectories the environment verified as solved, hint-free and uncorrected, per
family, and after each RL epoch takes supervised steps on a family-balanced draw of them
(ReLIFT), reporting `replayed` in its final status; `steps: 0` is the job without replay.
The job tests run the real job code path (`training.jobs.TokenJob`: load, samples, train,
save) on a real tiny transformers model; only the data comes from a list instead of
JetStream (the service's path is `tests/training/test_tooluse_job_hints.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.envs.tooluse.hints import with_hint
from agentrl.envs.tooluse.tasks import generate_task
from agentrl.learners.tooluse_job_replay import JobReplaySettings, replay_of_records
from agentrl.training.dataset import Record

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}
HINT = "Hint: SECRET-4412 the answer is 7"
FROZENLAKE = {
    "trajectory_id": "fl",
    "task_context": {"env_id": "frozenlake-4x4", "seed": 1},
    "metadata": {"outcome": {"task_status": "completed_successfully"}},
}


def attempt(
    family: str,
    seed: int,
    k: int,
    success: bool,
    *,
    question: str | None = None,
    pool: str | None = None,
    cut: bool = False,
    first_tool: str = "calculator",
) -> dict[str, Any]:
    """A logged tool-use attempt as `rollout.convert` writes the loop's episodes: a
    calculator call (or `first_tool`'s), its result, then the answer; every reply's
    completion-log row is `c-<trajectory>-<turn>`."""
    task = generate_task(seed, family)
    tid = f"{family}-{seed}-{k}"
    turns = []
    call = {"expression": "3 + 4"} if first_tool == "calculator" else {"code": "print(3 + 4)"}
    for j, (tool, args) in enumerate([(first_tool, call), ("response", {"text": "7"})]):
        turns.append(
            {
                "turn_id": j + 1,
                "observation": {
                    "type": "user_message" if j == 0 else "tool_result",
                    "content": (question or task.question)
                    if j == 0
                    else json.dumps({"tool_name": "calculator", "tool_result": "3 + 4 = 7"}),
                },
                "action": {
                    "type": "tool_call",
                    "tool_name": tool,
                    "tool_args": args,
                    "raw_response": json.dumps(
                        {"thoughts": [f"t{k}"], "tool_name": tool, "tool_args": args}
                    ),
                    "completion_id": f"c-{tid}-{j}",
                },
                "step_info": {"tool_name": tool, **({"answer": "7"} if j else {})},
                "logprobs": {"finish_reason": "length" if cut and j == 0 else "stop"},
            }
        )
    kwargs: dict[str, Any] = {"view": "agent_zero", **({"pool": pool} if pool else {})}
    return {
        "trajectory_id": tid,
        "end_timestamp": f"2026-11-29T10:{seed % 60:02d}:{k:02d}Z",
        "task_context": {
            "task_id": f"tooluse-{family}/seed-{seed}",
            "env_id": f"tooluse-{family}",
            "seed": seed,
            "env_kwargs": kwargs,
        },
        "turns": turns,
        "metadata": {"outcome": {"task_status": "completed_successfully" if success else "failed"}},
    }


def record(traj: dict[str, Any], total: float, correction: str | None = None) -> Record:
    reward: dict[str, Any] = {"trajectory_id": traj["trajectory_id"], "total_reward": total}
    if correction:
        reward["metadata"] = {"feedback": {"explicit": "thumbs_down", "correction": correction}}
    return Record(traj, reward)


def completions_of(recs: list[Record], tokenizer: Any) -> dict[str, dict[str, Any]]:
    """The completion log's rows of every reply: its exact tokens (a marker token first, so
    a test can tell the logged tokens from the text re-tokenised)."""
    out = {}
    for r in recs:
        for turn in r.trajectory.get("turns") or ():
            action = turn["action"]
            ids = [7, *tokenizer(action["raw_response"], add_special_tokens=False).input_ids]
            out[action["completion_id"]] = {"completion_token_ids": ids}
    return out


@pytest.fixture
def tokenizer(smol_tokenizer: Any) -> Any:
    return smol_tokenizer  # the tiny model's tokenizer is SmolLM2's


def test_the_replay_holds_only_verified_hint_free_uncorrected_successes(tokenizer: Any) -> None:
    hinted_question = with_hint(generate_task(8, "numbers").question, HINT)
    recs = [
        record(attempt("arithmetic", 5, 0, True), 1.0),  # replayed
        record(attempt("arithmetic", 5, 1, False), 1.0),  # shaped reward 1, env says failed
        record(attempt("numbers", 8, 0, True, question=hinted_question), 1.0),  # hinted success
        record(attempt("data", 6, 0, True), 1.0, correction="read the CSV first"),
        record(attempt("data", 9, 0, True, pool="unseen"), 1.0),  # held-out pool: never
        record(attempt("data", 10, 0, True, cut=True), 1.0),  # its first reply was cut
        record(attempt("numbers", 11, 0, True, question="Task: another prompt"), 1.0),
        Record(FROZENLAKE, {"trajectory_id": "fl", "total_reward": 1.0}),  # another env
    ]
    comps = completions_of(recs, tokenizer)
    job = replay_of_records(tokenizer, recs, JobReplaySettings(), comps)
    assert job.counts["replay_successes"] == 2 and job.replay.families() == ["arithmetic", "data"]
    assert job.skipped == {"not_hint_free": 1, "corrected": 1, "other_prompt": 1}
    items = job.replay.sample(1, torch.Generator().manual_seed(0))
    by_family = {f: [it for it in items if it.family == f] for f in ("arithmetic", "data")}
    assert len(by_family["arithmetic"]) == 2  # both replies of the verified success
    assert len(by_family["data"]) == 1  # the cut reply is no example; the answer is
    for it in items:
        prompt = tokenizer.decode(it.prompt_ids)
        assert "SECRET" not in prompt and "Hint:" not in prompt
        assert it.mode == "nll" and it.action_ids[0] == 7  # the completion log's tokens
    arith = generate_task(5, "arithmetic").question
    first, second = by_family["arithmetic"]
    assert arith in tokenizer.decode(first.prompt_ids)
    assert "3 + 4 = 7" in tokenizer.decode(second.prompt_ids)  # the turn's history
    # past the job's max_length a prompt keeps its newest tokens, as the RL samples do
    cut = replay_of_records(tokenizer, recs[:1], JobReplaySettings(), comps, max_length=64)
    for it in cut.replay.sample(1, torch.Generator().manual_seed(0)):
        assert len(it.prompt_ids) + len(it.action_ids) == 64
        full = next(x for x in items if x.action_ids == it.action_ids)
        assert full.prompt_ids[-len(it.prompt_ids) :] == it.prompt_ids


def test_a_hinted_success_is_never_replayed_with_its_hint(tokenizer: Any) -> None:
    """A job's importance step resamples with the hint: those successes train through the
    importance ratio, never as plain replay; and a logged episode whose prompt held a hint
    is not a replay example either (its tokens were written with the hint in context)."""
    from agentrl.learners.tooluse_episodes import EpisodeRecord
    from agentrl.learners.tooluse_replay import Replay

    q = generate_task(8, "numbers").question
    recs = [record(attempt("numbers", 8, k, True, question=with_hint(q, HINT)), 1.0)
            for k in range(3)]  # fmt: skip
    job = replay_of_records(tokenizer, recs, JobReplaySettings())
    assert len(job.replay) == 0 and job.skipped == {"not_hint_free": 3}
    hinted = EpisodeRecord("numbers", 8, q, success=True, hint=HINT)  # `agentrl learn`'s
    assert Replay().add_episodes([hinted]) == 0


def test_the_replay_draws_the_same_count_from_every_family(tokenizer: Any) -> None:
    recs = [record(attempt("arithmetic", s, 0, True), 1.0) for s in range(5)]
    recs.append(record(attempt("numbers", 40, 0, True), 1.0))
    job = replay_of_records(
        tokenizer, recs, JobReplaySettings(episodes_per_family=3, capacity_per_family=4)
    )
    assert job.counts["replay_successes"] == 6 and len(job.replay) == 4 + 1  # newest 4 kept
    items = job.replay.sample(3, torch.Generator().manual_seed(1))
    per = {f: sum(it.family == f for it in items) for f in ("arithmetic", "numbers")}
    assert per == {"arithmetic": 3 * 2, "numbers": 3 * 2}  # 3 episodes x 2 replies each


def test_the_warm_starts_verified_episodes_join_the_replay_first(tokenizer: Any) -> None:
    """With `warm_tasks_per_family` (a loop started from `agentrl learn`'s warm start), the
    warm start's scripted episodes on its own seeds, verified by the environment, are in the
    replay before the loop's own successes (the capacity keeps the newest: the loop's)."""
    settings = JobReplaySettings(warm_tasks_per_family=1, capacity_per_family=1)
    own = [record(attempt("arithmetic", 5, 0, True), 1.0)]
    job = replay_of_records(tokenizer, own, settings)
    assert job.counts["replay_warm"] == 3 and job.counts["replay_successes"] == 1
    assert job.replay.added == {"warm start": 3, "loop": 1}
    assert job.replay.families() == ["arithmetic", "data", "numbers"]
    items = job.replay.sample(1, torch.Generator().manual_seed(0))
    arith = [it for it in items if it.family == "arithmetic"]
    assert len(arith) == 2  # the loop's episode (the newest), not the warm start's
    assert generate_task(5, "arithmetic").question in tokenizer.decode(arith[0].prompt_ids)
    data = [it for it in items if it.family == "data"]  # a verified scripted solution
    assert data and '"tool_name": "response"' in tokenizer.decode(data[-1].action_ids)


def test_the_warm_starts_data_episodes_are_written_in_the_form_asked(tokenizer: Any) -> None:
    """`data_program="shown"` (issue 52, s33): the replay's scripted data episodes hold the
    table as the question shows it, read by column name; unset, the canonical form."""
    forms = {}
    for form in (None, "shown"):
        settings = JobReplaySettings(warm_tasks_per_family=2, data_program=form)
        job = replay_of_records(tokenizer, [], settings)
        calls = [
            tokenizer.decode(items[0].action_ids) for items in job.replay.held("data") if items
        ]
        assert len(calls) == 2
        forms[form] = calls
    assert all("C=[" in c and "D=[dict(zip(C,r))" in c for c in forms["shown"])
    assert all("C=[" not in c and "R=[(" in c for c in forms[None])


def test_the_replay_leaves_out_families_the_policy_already_solves(tokenizer: Any) -> None:
    """`success_bar`: a family whose verified success among the job's trajectories is at
    or above it is not replayed (its successes come from the RL steps themselves), the warm
    start's episodes of it neither; the others are, as before."""
    recs = [record(attempt("arithmetic", 5, k, k < 3), 1.0) for k in range(4)]  # 3 of 4
    recs += [record(attempt("numbers", 8, k, k == 0), 1.0) for k in range(4)]  # 1 of 4
    every = replay_of_records(tokenizer, recs, JobReplaySettings())
    assert every.replay.families() == ["arithmetic", "numbers"]
    bar = JobReplaySettings(success_bar=0.5, warm_tasks_per_family=1)
    job = replay_of_records(tokenizer, recs, bar)
    assert job.replay.families() == ["data", "numbers"]  # data: the warm start's only
    assert job.counts["replay_families_solved"] == 1 and job.skipped == {"family_solved": 3}
    assert job.replay.added == {"warm start": 2, "loop": 1}


def test_balance_openings_draws_as_many_calculator_openings_as_code_exe(tokenizer: Any) -> None:
    """`balance_openings`: a family-balanced pass of one calculator family and two code_exe
    families opens twice as many episodes with code_exe (what sent arithmetic to code_exe,
    2026-12-01); balanced, episodes opening with the calculator are added until the counts
    are equal, the family draw itself unchanged. Only an episode's first reply counts."""
    from agentrl.learners.tooluse_replay import opening_counts

    recs = [record(attempt("arithmetic", s, 0, True), 1.0) for s in (1, 2)]
    recs += [record(attempt("data", s, 0, True, first_tool="code_exe"), 1.0) for s in (3, 4)]
    recs += [record(attempt("numbers", s, 0, True, first_tool="code_exe"), 1.0) for s in (5, 6)]
    plain = replay_of_records(tokenizer, recs, JobReplaySettings(episodes_per_family=2), seed=3)
    assert plain.replay.openings() == {"calculator": 2, "code_exe": 4}
    off = plain.draw(plain.generator)
    assert opening_counts(off) == {"calculator": 2, "code_exe": 4}
    settings = JobReplaySettings(episodes_per_family=2, balance_openings=True)
    job = replay_of_records(tokenizer, recs, settings, seed=3)
    on = job.draw(job.generator)
    assert opening_counts(on) == {"calculator": 4, "code_exe": 4}
    assert [it.action_ids for it in on[: len(off)]] == [it.action_ids for it in off]
    assert {it.family for it in on[len(off) :]} == {"arithmetic"}  # 2 more episodes, 4 replies
    assert len(on) == len(off) + 4 and sum(it.opening is None for it in on) == 8  # the answers
    assert job.openings == {"calculator": 4, "code_exe": 4} and job.counts["replayed"] == 16


def test_balance_openings_tops_up_a_tool_the_family_draw_missed(tokenizer: Any) -> None:
    """A tool the replay holds but the draw did not pick is added from whichever families
    hold it (numbers here, beside its code_exe episodes); an episode whose first reply was
    cut has no opening turn and counts for no tool; the warm start's scripted episodes are
    labelled by the solver's tool (arithmetic: the calculator; data, numbers: code_exe)."""
    from agentrl.learners.tooluse_replay import Replay, opening_counts

    recs = [record(attempt("data", s, 0, True, first_tool="code_exe"), 1.0) for s in (3, 4)]
    recs.append(record(attempt("numbers", 5, 0, True), 1.0))  # a calculator opening
    recs.append(record(attempt("numbers", 7, 0, True, first_tool="code_exe", cut=True), 1.0))
    job = replay_of_records(tokenizer, recs, JobReplaySettings())
    assert job.replay.openings() == {"calculator": 1, "code_exe": 2}
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        counts = opening_counts(job.replay.sample(3, gen, balance_openings=True))
        assert counts["calculator"] == counts["code_exe"] >= 3
    warm = replay_of_records(tokenizer, [], JobReplaySettings(warm_tasks_per_family=1))
    assert warm.replay.openings() == {"calculator": 1, "code_exe": 2}
    one_tool = Replay()
    one_tool.add("data", job.replay.held("data")[0], opening="code_exe")
    assert len(one_tool.sample(2, gen, balance_openings=True)) == 2 * 2  # nothing to balance


# -- the job --------------------------------------------------------------------------------


def run_job(tmp_path: Path, recs: list[Record], **hyper: Any) -> tuple[Any, dict[str, Any]]:
    """One dataset job of the tool-use loop's kind (GiGPO, PPO-clip, tokens trainer) on
    `recs`: TokenJob's own load -> samples -> train -> save; the job and its final status."""
    from agentrl.training.dataset import FilterReport
    from agentrl.training.jobs import Sample, TokenJob
    from agentrl.training.jobspec import JobSpec
    from agentrl.training.progress import Emitter
    from agentrl.training.requests import fill_request
    from agentrl.training.settings import TrainingSettings

    req = fill_request(
        {
            "training_config": {
                "base_model": "tiny",
                "algorithm": "gigpo",
                "dataset": {"sample_size": len(recs)},
                "hyperparameters": {
                    "objective": "pg",
                    "trainer": "tokens",
                    "epochs": 2,
                    "batch_size": 4,
                    "learning_rate": 1e-2,
                    **hyper,
                },
            },
            "evaluation": {"enabled": False, "holdout_size": 0.0},
        },
        TrainingSettings(),
    )
    spec = JobSpec.of({
        "request": req.model_dump(mode="json"), "job_dir": str(tmp_path),
        "storage_path": str(tmp_path / "ckpt"), "max_length": 512, "tiny_kwargs": TINY,
    })  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    events = tmp_path / "events.jsonl"
    report = FilterReport(rewards=len(recs))
    data = Sample("tokens", list(recs), [], report, {"completions": {}, "corrections": []}, 0.0)
    job = TokenJob(spec, Emitter(events), data)
    job.load_model()
    job.start = [p.detach().clone() for p in trainable(job)]
    job.samples()
    job.train()
    job.save()
    final = json.loads(events.read_text().splitlines()[-1])
    assert final["status"] == "completed", final
    return job, final


def trainable(job: Any) -> list[torch.Tensor]:
    return [p for p in job.trainer.policy.model.parameters() if p.requires_grad]


def losses(job: Any) -> list[tuple[float, float]]:
    return [(m["loss"], m["grad_norm"]) for m in job.history]  # not the timings


def mixed_records() -> list[Record]:
    """Two task groups with a success and failures each (RL has advantages), two families."""
    recs = [record(attempt("arithmetic", 5, k, k == 0), 1.0 if k == 0 else 0.1) for k in range(3)]
    recs += [record(attempt("numbers", 8, k, k == 0), 1.0 if k == 0 else 0.0) for k in range(2)]
    return recs


def test_a_job_whose_rl_has_nothing_to_learn_trains_through_the_replay(tmp_path: Path) -> None:
    """Every attempt succeeded: all advantages are 0, so the RL term has no sample; the
    replay's supervised steps alone move the weights, after each of the 2 epochs."""
    from agentrl.core.errors import TrainingError

    recs = [record(attempt("arithmetic", 5, k, True), 1.0) for k in range(2)]
    recs += [record(attempt("data", 6, 0, True), 1.0)]
    with pytest.raises(TrainingError, match="nothing to train on"):  # without the replay
        run_job(tmp_path / "off", recs)
    replay = {"steps": 1, "episodes_per_family": 2, "batch_size": 4}
    job, final = run_job(tmp_path / "on", recs, tooluse_replay=replay)
    assert job.units == [] and job.history == []  # no RL step
    assert any(not torch.equal(a, b) for a, b in zip(job.start, trainable(job), strict=True))
    current = final["metrics"]["current"]
    # 2 epochs x 1 pass x 2 families x 2 episodes x 2 replies
    assert current["replayed"] == 2 * 2 * 2 * 2 and current["replay_successes"] == 3
    assert current["replay_families"] == 2 and current["replay_updates"] == 2 * 2
    assert job.trainer.global_step == 0  # replay steps are not the job's steps


def test_replay_steps_zero_trains_exactly_as_before(tmp_path: Path) -> None:
    before, status = run_job(tmp_path / "before", mixed_records())
    assert "replayed" not in status["metrics"]["current"]
    off, status_off = run_job(tmp_path / "off", mixed_records(), tooluse_replay={"steps": 0})
    assert off.replay is None and "replayed" not in status_off["metrics"]["current"]
    assert before.history and losses(off) == losses(before)
    for a, b in zip(trainable(before), trainable(off), strict=True):
        assert torch.equal(a, b)
    # the loop's default (`--replay-steps 1`): the same RL steps, a replay after each epoch
    from agentrl.app.loop_config import LoopConfig
    from agentrl.app.loop_tooluse import job_hints, job_replay
    from agentrl.learners.tooluse_job import JobHints

    balanced = LoopConfig.tooluse()  # the tool-use profile balances the opening turns
    replay_on = job_replay(balanced)
    assert replay_on is not None and JobReplaySettings(**replay_on).balance_openings
    assert JobHints(**job_hints(balanced) or {}).balance_openings
    plain = LoopConfig.tooluse(balance_openings=False)  # `--set balance_openings=false`
    loops = job_replay(plain)
    assert loops is not None and not JobReplaySettings(**loops).balance_openings
    assert not JobHints(**job_hints(plain) or {}).balance_openings
    on, status_on = run_job(tmp_path / "on", mixed_records(), tooluse_replay=loops)
    # `rounds: 1`: one round (after the first of the 2 epochs) x 1 pass x 1 family x 4 episodes x 2 replies: numbers
    # (1 of 2 solved) is at the loop's success bar of 0.5, so only arithmetic (1 of 3) replays
    current = status_on["metrics"]["current"]
    assert current["replayed"] == 1 * 1 * 4 * 2 and current["replay_families_solved"] == 1
    assert on.trainer.global_step == before.trainer.global_step  # the same RL steps
    assert any(not torch.equal(a, b) for a, b in zip(trainable(before), trainable(on), strict=True))


def played_attempt(family: str, seed: int, replies: list[str], tid: str) -> dict[str, Any]:
    """A failed attempt played by the real environment (Agent Zero's view, as the loop
    logs it): each reply, the message the environment answered it with, its step info."""
    from agentrl.envs.tooluse import ToolUseEnv

    env = ToolUseEnv(family=family, max_steps=4, view="agent_zero")
    obs = env.reset(seed)
    turns, content = [], obs["text"]
    for j, text in enumerate(replies):
        nxt, _, _, info = env.step(text)
        turns.append(
            {
                "turn_id": j + 1,
                "observation": {
                    "type": "user_message" if j == 0 else "tool_result",
                    "content": content,
                },
                "action": {"type": "tool_call", "raw_response": text},
                "step_info": info,
                "logprobs": {"finish_reason": "stop"},
            }
        )
        content = nxt["text"]
    return {
        "trajectory_id": tid,
        "task_context": {
            "env_id": f"tooluse-{family}",
            "seed": seed,
            "env_kwargs": {"view": "agent_zero"},
        },
        "turns": turns,
        "metadata": {"outcome": {"task_status": "failed"}},
    }


def test_a_retry_after_a_tool_error_is_the_solvers_call_on_the_attempts_own_context(
    tokenizer: Any,
) -> None:
    """With `retries`, a failed hint-free attempt whose call errored joins the replay as a
    retry: its turns up to the error's message as logged, then the scripted solver's call,
    its result as the environment shows it after those steps, and the solver's answer,
    which the environment verifies. The erroneous reply is never trained; off by default;
    a corrected attempt, one with no step left after the error, or one without an error
    adds nothing."""
    from agentrl.envs.tooluse.agent_prompt import SYSTEM_PROMPT, reply
    from agentrl.envs.tooluse.solver import THOUGHT_ANSWER, THOUGHT_CALC, first_reply
    from agentrl.learners.tooluse_job_replay import retry_items
    from agentrl.llm.samples import render_prompt

    seed = 11
    task = generate_task(seed, "arithmetic")
    bad = reply(THOUGHT_CALC, "calculator", expression="(1 +")
    wrong = reply(THOUGHT_ANSWER, "response", text="7")
    errored = played_attempt("arithmetic", seed, [bad, wrong], "e")
    assert errored["turns"][0]["step_info"]["tool_error"]
    error_msg = errored["turns"][1]["observation"]["content"]
    assert "calculator error" in error_msg and "tool_result" in error_msg  # Agent Zero's
    recs = [record(errored, 0.0)]
    off = replay_of_records(tokenizer, recs, JobReplaySettings())
    assert len(off.replay) == 0 and off.counts["replay_retries"] == 0
    on = replay_of_records(tokenizer, recs, JobReplaySettings(retries=True))
    assert on.counts["replay_retries"] == 1 and on.replay.added == {"retry": 1}
    (items,) = on.replay.held("arithmetic")
    call, answer = (tokenizer.decode(it.action_ids, skip_special_tokens=True) for it in items)
    assert call == first_reply(task)
    assert json.loads(answer)["tool_args"]["text"] == str(task.answer)
    seen = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.question},
        {"role": "assistant", "content": bad},
        {"role": "user", "content": error_msg},
    ]
    assert items[0].prompt_ids == render_prompt(tokenizer, seen)  # its own error, as logged
    second = tokenizer.decode(items[1].prompt_ids)
    assert second.startswith(tokenizer.decode(items[0].prompt_ids))
    assert f"= {task.answer}" in second and "Steps left: 2" in second  # after two steps
    assert all(wrong not in tokenizer.decode(it.prompt_ids) for it in items)
    assert all(bad != tokenizer.decode(it.action_ids, skip_special_tokens=True) for it in items)
    # nothing to retry: corrected, no step left after the error, or no error at all
    corrected = replay_of_records(
        tokenizer, [record(errored, 0.0, correction="x")], JobReplaySettings(retries=True)
    )
    assert corrected.skipped == {"retry_corrected": 1} and len(corrected.replay) == 0
    ok = reply(THOUGHT_CALC, "calculator", expression="1 + 1")
    late = played_attempt("arithmetic", seed, [ok, ok, bad, wrong], "l")  # error at step 3 of 4
    assert late["turns"][2]["step_info"]["tool_error"]
    assert retry_items(tokenizer, late, 4) == ([], "retry_no_steps_left")
    calm = played_attempt("arithmetic", seed, [wrong], "c")
    assert retry_items(tokenizer, calm, 4) == ([], None)
