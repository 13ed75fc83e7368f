"""A loop job's tool-use hint step (issue 52) on logged trajectories and a tiny random
model: only tasks whose every attempt failed are hinted, a user's correction (the reward's
`metadata.feedback.correction`, `Record.hint`) is the hint, the hint never reaches a trained
prompt, and training the items moves the policy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.envs.tooluse.tasks import generate_task
from agentrl.learners.tooluse_job import JobHints, failed_groups, hint_step, task_key
from agentrl.training.dataset import Record

SECRET = "SECRET-7731 call the calculator with the whole expression"


def tooluse_trajectory(
    family: str, seed: int, k: int, success: bool, turns: int = 2
) -> dict[str, Any]:
    """A logged tool-use attempt shaped as `rollout.convert` writes the loop's episodes."""
    task = generate_task(seed, family)
    out = []
    for j in range(turns):
        last = j == turns - 1
        tool = "response" if last else "calculator"
        args = {"text": "7"} if last else {"expression": "1 + 2"}
        out.append(
            {
                "turn_id": j + 1,
                "observation": {
                    "type": "user_message" if j == 0 else "tool_result",
                    "content": task.question
                    if j == 0
                    else json.dumps({"tool_name": "calculator", "tool_result": "1 + 2 = 3"}),
                },
                "action": {
                    "type": "tool_call",
                    "tool_name": tool,
                    "tool_args": args,
                    "raw_response": json.dumps(
                        {"thoughts": ["go"], "tool_name": tool, "tool_args": args}
                    ),
                },
                "step_info": {"tool_name": tool, **({"answer": "7"} if last else {})},
                "logprobs": {"finish_reason": "stop"},
            }
        )
    return {
        "trajectory_id": f"{family}-{seed}-{k}",
        "task_context": {
            "task_id": f"tooluse-{family}/seed-{seed}",
            "env_id": f"tooluse-{family}",
            "seed": seed,
            "env_kwargs": {"view": "agent_zero"},
        },
        "turns": out,
        "metadata": {"outcome": {"task_status": "completed_successfully" if success else "failed"}},
    }


def record(traj: dict[str, Any], correction: str | None = None) -> Record:
    reward: dict[str, Any] = {"trajectory_id": traj["trajectory_id"], "total_reward": 0.1}
    if correction:
        reward["metadata"] = {"feedback": {"explicit": "thumbs_down", "correction": correction}}
    return Record(traj, reward)


def records() -> list[Record]:
    return [
        record(tooluse_trajectory("arithmetic", 5, 0, False)),
        record(tooluse_trajectory("arithmetic", 5, 1, False), correction=SECRET),
        record(tooluse_trajectory("data", 6, 0, True)),  # one success: not hinted
        record(tooluse_trajectory("data", 6, 1, False)),
        record(tooluse_trajectory("numbers", 7, 0, False)),
        Record(  # another environment's trajectory: never a tool-use hint
            {"trajectory_id": "fl", "task_context": {"env_id": "frozenlake-4x4", "seed": 1}},
            {"trajectory_id": "fl", "total_reward": 0.0},
        ),
    ]


@pytest.fixture
def trainer(tmp_path: Path) -> Any:
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.trainer import PolicyTrainer

    cfg = TrainerConfig(model="tiny", seed=0, learning_rate=1e-2, storage_path=str(tmp_path))
    return PolicyTrainer.from_config(cfg, None)


def test_only_tasks_whose_every_attempt_failed_are_hinted() -> None:
    recs = records()
    assert task_key(recs[0].trajectory) == ("arithmetic", 5)
    assert task_key(recs[-1].trajectory) is None
    assert list(failed_groups(recs)) == [("arithmetic", 5), ("numbers", 7)]


def test_distill_uses_the_users_correction_and_never_trains_the_hint(trainer: Any) -> None:
    tok = trainer.policy.tokenizer
    step = hint_step(trainer, records(), JobHints(mode="distill"))
    assert step.counts["hinted_tasks"] == 2 and step.counts["corrections_used"] == 1
    assert SECRET in step.hints[("arithmetic", 5)]  # the correction is the hint
    assert SECRET not in step.hints[("numbers", 7)]  # the checker's words there
    assert "The task needs" in step.hints[("numbers", 7)]
    # every turn of the three failed attempts, on their own tokens
    assert len(step.items) == 3 * 2 and step.counts["hint_items"] == 6
    for it in step.items:
        assert "Hint:" not in tok.decode(it.prompt_ids)  # the trained prompt: hint-free
        assert "Hint:" in tok.decode(it.hinted_prompt_ids or [])  # the teacher's
    fams = {it.family for it in step.items}
    assert fams == {"arithmetic", "numbers"}
    before = [p.detach().clone() for p in trainer.policy.model.parameters() if p.requires_grad]
    out = step.train(trainer, JobHints(mode="distill"))
    assert out["steps"] >= 1 and out["tokens"] > 0
    after = [p for p in trainer.policy.model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_importance_resamples_with_the_hint_and_counts_what_it_found(trainer: Any) -> None:
    settings = JobHints(mode="importance", samples=2, max_tasks=1, max_new_tokens=16, max_steps=2)
    step = hint_step(trainer, records(), settings)
    # the first failed task only (max_tasks), its correction the hint, resampled twice
    assert step.counts["hinted_tasks"] == 1 and step.counts["corrections_used"] == 1
    assert step.counts["hinted_samples"] == 2
    assert 0 <= step.counts["hinted_successes"] <= 2
    assert bool(step.items) == (step.counts["hinted_successes"] > 0)
    tok = trainer.policy.tokenizer
    for it in step.items:  # a tiny random model rarely succeeds; whatever it trains is clean
        assert "Hint:" not in tok.decode(it.prompt_ids)


def test_no_failed_group_no_hints(trainer: Any) -> None:
    ok = [record(tooluse_trajectory("data", 6, 0, True))]
    step = hint_step(trainer, ok, JobHints())
    assert step.items == [] and step.counts["hinted_tasks"] == 0


def hinted_success(trainer: Any, family: str, seed: int, hint: str) -> Any:
    """A hinted resample that succeeded: its turn's prompt holds the hint, its free prompt not."""
    from agentrl.learners.tooluse_episodes import EpisodeRecord, TurnRecord

    tok = trainer.policy.tokenizer
    q = generate_task(seed, family).question
    turn = TurnRecord(
        prompt_ids=tok.encode(f"{q}\n\n{hint}"),
        action_ids=tok.encode('{"tool_name": "response"}'),
        logprobs=[-0.5] * 6,
        text="{}",
        finish="stop",
        tool_name="response",
        free_prompt_ids=tok.encode(q),
    )
    return EpisodeRecord(family, seed, q, [turn], success=True, answered=True, hint=hint)


@pytest.mark.parametrize(("mode", "item_mode"), [("sft", "nll"), ("importance", "importance")])
def test_given_resamples_are_reused_and_sft_trains_them_as_plain_nll(
    trainer: Any, mode: str, item_mode: str
) -> None:
    """A bench passes the hinted resamples it saved (`hinted=`): nothing is sampled again,
    only the hinted tasks' resamples count, and sft trains the hinted successes' tokens on
    the hint-free prompt with weight 1 (no importance ratio, no hinted prompt needed)."""
    tok = trainer.policy.tokenizer
    given = [
        hinted_success(trainer, "arithmetic", 5, "Hint: x"),
        hinted_success(trainer, "data", 6, "Hint: y"),  # data 6 had a success: not hinted
    ]
    settings = JobHints(mode=mode, samples=1, max_tasks=1)
    step = hint_step(trainer, records(), settings, hinted=given)
    assert step.counts["hinted_tasks"] == 1
    assert step.counts["hinted_samples"] == 1 and step.counts["hinted_successes"] == 1
    assert [it.mode for it in step.items] == [item_mode]
    (it,) = step.items
    assert "Hint:" not in tok.decode(it.prompt_ids)
    assert it.prompt_ids == given[0].turns[0].free_prompt_ids
    assert it.action_ids == given[0].turns[0].action_ids
    out = step.train(trainer, settings)
    assert out["steps"] == 1
    if mode == "sft":
        assert out["mean_coef"] == pytest.approx(1.0)  # plain NLL


@pytest.mark.parametrize("mode", ["sft", "importance"])
def test_a_numbers_hint_is_the_solvers_reply_and_never_enters_the_trained_prompt(
    trainer: Any, mode: str
) -> None:
    """Numbers' hint is the solver's first reply as JSON (its program in plain text made the
    light warm start call the calculator), after the checker's verdict on the logged
    attempts; it never holds the answer, and a hinted success that copied it is trained on
    the hint-free prompt: neither the hint nor its call is in the trained context."""
    from agentrl.envs.tooluse.solver import first_reply

    tok = trainer.policy.tokenizer
    task = generate_task(7, "numbers")
    settings = JobHints(mode=mode, samples=1)
    hint = hint_step(trainer, records(), settings, hinted=[]).hints[("numbers", 7)]
    call = first_reply(task)
    assert hint.startswith("Hint: Earlier attempts failed: the final answers '7' are not")
    assert hint.endswith(f"Reply with {call}") and '"tool_name": "code_exe"' in call
    assert str(task.answer) not in hint  # (the answer: only running the program shows it)
    ep = hinted_success(trainer, "numbers", 7, hint)  # it copied the call: code_exe ran
    first = dataclasses.replace(ep.turns[0], text=call, action_ids=tok.encode(call))
    first.tool_name, first.logprobs = "code_exe", [-0.1] * len(first.action_ids)
    ep.turns[0] = first
    step = hint_step(trainer, records(), settings, hinted=[ep])
    assert step.counts["hinted_successes"] == 1 and step.counts["hint_items"] == 1
    (it,) = step.items
    trained = tok.decode(it.prompt_ids)
    assert trained == task.question and "Hint:" not in trained and "Reply with" not in trained
    assert tok.decode(it.action_ids) == call


def test_the_hint_step_decodes_at_most_play_batch_episodes_together() -> None:
    """A job hinting 60 tasks three times decodes 32 episodes at a time, not all 180 at
    once (every prompt's cache held together); a small step decodes all of its together."""
    from agentrl.learners.tooluse_job import play_config

    assert play_config(JobHints(samples=3), 60, 0).batch_size == 32
    assert play_config(JobHints(samples=3, play_batch=8), 60, 0).batch_size == 8
    small = play_config(JobHints(samples=3, temperature=0.3), 2, 5)
    assert (small.batch_size, small.hint_samples, small.temperature) == (6, 3, 0.3)


def hinted_win(family: str, seed: int, lengths: list[int]) -> Any:
    """A hinted success whose finished replies have these token counts (ids made up)."""
    from agentrl.learners.tooluse_episodes import EpisodeRecord, TurnRecord

    turns = [
        TurnRecord(
            prompt_ids=[1, 2],
            action_ids=[5] * n,
            logprobs=[-0.1] * n,
            text="{}",
            finish="stop",
            free_prompt_ids=[1],
        )
        for n in lengths
    ]
    return EpisodeRecord(family, seed, "q", turns, success=True, answered=True, hint="Hint: h")


def test_the_length_check_drops_hinted_successes_with_a_reply_over_the_bound(
    trainer: Any,
) -> None:
    """A hinted success with any reply longer than `max_reply_tokens`, or (with
    `family_bound`) than its family's longest verified hint-free reply, is not trained;
    a family with no bound keeps its successes; off by default (today's behaviour)."""
    from agentrl.learners.tooluse_job import fits, verified_reply_bounds

    tok = trainer.policy.tokenizer
    given = [
        hinted_success(trainer, "arithmetic", 5, "Hint: x"),
        hinted_success(trainer, "numbers", 7, "Hint: y"),
    ]
    given[0].turns[0].action_ids = given[0].turns[0].action_ids * 8  # a long reply
    long_n = len(given[0].turns[0].action_ids)
    short_n = len(given[1].turns[0].action_ids)
    off = hint_step(trainer, records(), JobHints(mode="sft", samples=1), hinted=given)
    assert off.counts["hint_too_long"] == 0 and len(off.items) == 2
    capped = JobHints(mode="sft", samples=1, max_reply_tokens=long_n - 1)
    step = hint_step(trainer, records(), capped, hinted=given)
    assert step.counts["hint_too_long"] == 1 and step.counts["hinted_successes"] == 2
    assert [it.family for it in step.items] == ["numbers"]
    # per family: what the check dropped and what the items call ("{}": no thought)
    zero = {"successes": 1, "too_long": 0, "capped": 0, "items": 0, "solver_thought": 0}
    assert step.by_family == {
        "arithmetic": {**zero, "too_long": 1},
        "numbers": {**zero, "items": 1, "response": 1},
    }
    # the family's bound: the data success of records() is data's; arithmetic gets one given
    own = verified_reply_bounds(records(), {}, tok)
    assert list(own) == ["data"] and own["data"] > 0
    by_family = JobHints(mode="sft", samples=1, family_bound=True)
    step = hint_step(
        trainer, records(), by_family, hinted=given, reply_bounds={"arithmetic": long_n - 1}
    )
    assert step.counts["hint_too_long"] == 1 and [it.family for it in step.items] == ["numbers"]
    assert fits(given[1], None, {"numbers": short_n}) and not fits(given[1], None, {"numbers": 1})
    assert fits(given[0], None, {})  # no bound for its family: kept


def test_the_family_cap_keeps_every_family_at_most_half_of_a_pass() -> None:
    """`cap_share`: an over-share family loses its longest hinted successes first until it
    is at most the share of the pass (the other families' items and a replay draw's
    counted); a lone family is left whole; None is no cap."""
    from agentrl.learners.tooluse_job import cap_share

    data = [hinted_win("data", s, [n, 10]) for s, n in enumerate([90, 30, 150, 60, 120])]
    arith = [hinted_win("arithmetic", 50, [40, 10])]
    kept = cap_share(data + arith, 0.5, {})
    assert [ep.seed for ep in kept] == [1, 50]  # data: its shortest success, 2 items of 4
    with_replay = cap_share(data + arith, 0.5, {"numbers": 4})
    assert [ep.seed for ep in with_replay] == [0, 1, 3, 50]  # the two longest dropped
    items = {"data": 6, "arithmetic": 2, "numbers": 4}
    assert max(items.values()) <= 0.5 * sum(items.values())
    assert cap_share(data, 0.5, {}) == data  # nothing to balance it against
    assert cap_share(data + arith, None, {}) == data + arith


def test_the_hint_step_caps_a_family_and_counts_it(trainer: Any) -> None:
    given = [
        hinted_success(trainer, "arithmetic", 5, "Hint: x"),
        hinted_success(trainer, "numbers", 7, "Hint: y"),
    ]
    settings = JobHints(mode="sft", samples=1, max_family_share=0.5)
    step = hint_step(trainer, records(), settings, hinted=given, other_items={"numbers": 3})
    # numbers would be 4 of 5 items: its one success dropped, arithmetic's kept
    assert step.counts["hint_capped"] == 1 and [it.family for it in step.items] == ["arithmetic"]
    assert step.by_family["numbers"] == {
        "successes": 1, "too_long": 0, "capped": 1, "items": 0, "solver_thought": 0
    }  # fmt: skip
    assert step.by_family["arithmetic"]["items"] == step.by_family["arithmetic"]["response"] == 1


def test_a_pass_with_the_replay_trains_hint_free_items_family_balanced(trainer: Any) -> None:
    """The replay's draws are shuffled into the hint items' pass: verified hint-free
    successes (plain NLL, no hint in their context), each family the same total weight,
    counted in the replay's `replayed`; training the pass moves the policy."""
    from agentrl.learners.tooluse_job_replay import JobReplaySettings, replay_of_records

    tok = trainer.policy.tokenizer
    given = [hinted_success(trainer, "arithmetic", 5, "Hint: x")]
    settings = JobHints(mode="importance", samples=1, max_tasks=1)
    step = hint_step(trainer, records(), settings, hinted=given)
    replay = replay_of_records(tok, records(), JobReplaySettings(steps=2, episodes_per_family=1))
    assert replay.replay.families() == ["data"]  # records()'s one verified success
    items = step.pass_items(replay, torch.Generator().manual_seed(0))
    drawn = [it for it in items if it.family == "data"]
    assert len(drawn) == 2 * 2 and replay.counts["replayed"] == 4  # 2 draws x 2 replies
    for it in items:
        prompt = tok.decode(it.prompt_ids)
        assert "Hint:" not in prompt and SECRET not in prompt
    assert {it.mode for it in drawn} == {"nll"}
    weight = {f: sum(it.weight for it in items if it.family == f) for f in ("arithmetic", "data")}
    assert weight["arithmetic"] == pytest.approx(weight["data"])
    assert step.items[0].weight == 1.0  # the step's own items are not reweighted in place
    before = [p.detach().clone() for p in trainer.policy.model.parameters() if p.requires_grad]
    out = step.train(trainer, settings, replay=replay)
    assert out["steps"] == 1 and out["tokens"] > 0 and replay.counts["replayed"] == 8
    after = [p for p in trainer.policy.model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def hinted_call(trainer: Any, family: str, seed: int, tool: str) -> Any:
    """A hinted success that opens with `tool`, then answers: two items, the first an
    opening turn."""
    from agentrl.learners.tooluse_episodes import EpisodeRecord, TurnRecord

    tok = trainer.policy.tokenizer
    q = generate_task(seed, family).question
    turns = [
        TurnRecord(
            prompt_ids=tok.encode(f"{q}\n\nHint: h{k}"),
            action_ids=tok.encode(f'{{"tool_name": "{name}"}}'),
            logprobs=[-0.5] * 6,
            text="{}",
            finish="stop",
            tool_name=name,
            free_prompt_ids=tok.encode(q + " " * k),
        )
        for k, name in enumerate((tool, "response"))
    ]
    return EpisodeRecord(family, seed, q, turns, success=True, answered=True, hint="Hint: h")


def test_balance_openings_weighs_a_passs_opening_turns_the_same_per_tool(trainer: Any) -> None:
    """`JobHints.balance_openings`: after the family balance, the opening turns of each tool
    carry the same total weight (their sum unchanged, the answers' weights as they were).
    Here arithmetic's hinted successes open once with each tool, numbers' with code_exe:
    families equal, code_exe's openings weigh three times the calculator's without it."""
    given = [
        hinted_call(trainer, "arithmetic", 5, "calculator"),
        hinted_call(trainer, "arithmetic", 5, "code_exe"),
        hinted_call(trainer, "numbers", 7, "code_exe"),
    ]
    plain = hint_step(trainer, records(), JobHints(mode="sft", samples=2), hinted=given)
    openings = [it.opening for it in plain.items]
    assert openings == ["calculator", None, "code_exe", None, "code_exe", None]

    def weights(items: list[Any]) -> dict[str | None, float]:
        out: dict[str | None, float] = {}
        for it in items:
            out[it.opening] = out.get(it.opening, 0.0) + it.weight
        return out

    off = weights(plain.pass_items())
    assert off["code_exe"] == pytest.approx(3 * off["calculator"])
    on = weights(plain.pass_items(openings=True))
    assert on["calculator"] == pytest.approx(on["code_exe"])
    assert on["calculator"] + on["code_exe"] == pytest.approx(off["calculator"] + off["code_exe"])
    assert on[None] == pytest.approx(off[None])  # the answers: the family balance's weights
    assert JobHints(mode="sft", balance_openings=True).balance_openings
    assert not JobHints().balance_openings


def test_relabel_gives_each_trained_reply_its_tools_thought_and_keeps_the_call(
    trainer: Any,
) -> None:
    """With `relabel_thoughts` (sft only) a hinted success's reply is trained with the
    scripted solver's thought for the tool it called; its call's tokens stay as sampled,
    a reply already with that thought or not in the schema's shape is left alone, the
    given episodes are not changed, and the step counts the replies relabelled."""
    import pydantic

    from agentrl.envs.tooluse.solver import THOUGHT_ANSWER, THOUGHT_CODE
    from agentrl.learners.tooluse_job import relabel_thoughts, relabelled

    tok = trainer.policy.tokenizer
    call = '"tool_name": "code_exe", "tool_args": {"code": "print(sum([1, 2]))"}}'
    text = '{"thoughts": ["Answer with the tool\'s result."], ' + call
    ep = hinted_success(trainer, "numbers", 7, "Hint: y")
    first = ep.turns[0]
    # sampled tokens: the call one character a token (not how the tokenizer would split it)
    sampled = [i for ch in ", " + call for i in tok.encode(ch, add_special_tokens=False)]
    first.text, first.tool_name = text, "code_exe"
    first.action_ids = tok.encode(text[: -len(", " + call)]) + sampled
    answer = '{"thoughts": ["' + THOUGHT_ANSWER + '"], "tool_name": "response", '
    answer += '"tool_args": {"text": "3"}}'
    ep.turns.append(
        dataclasses.replace(first, text=answer, action_ids=tok.encode(answer), tool_name="response")
    )
    (out,), changed = relabel_thoughts([ep], tok)
    assert changed == 1 and out.turns[1] is ep.turns[1]  # the answer's thought was right
    new = out.turns[0]
    assert json.loads(new.text) == {**json.loads(text), "thoughts": [THOUGHT_CODE]}
    assert tok.decode(new.action_ids) == new.text and new.logprobs == []
    assert new.action_ids[-len(sampled) :] == sampled  # the call's tokens, as sampled
    assert ep.turns[0].text == text  # the given episode is untouched
    assert relabelled(new, tok) is None
    assert relabelled(dataclasses.replace(first, text="{}"), tok) is None
    assert relabelled(dataclasses.replace(first, invalid=True), tok) is None
    with pytest.raises(pydantic.ValidationError, match="needs mode 'sft'"):
        JobHints(mode="importance", relabel_thoughts=True)
    settings = JobHints(mode="sft", samples=1, relabel_thoughts=True)
    step = hint_step(trainer, records(), settings, hinted=[ep])
    assert step.counts["hint_relabelled"] == 1
    assert [tok.decode(it.action_ids) for it in step.items] == [new.text, answer]
    assert all("Hint:" not in tok.decode(it.prompt_ids) for it in step.items)
    off = hint_step(trainer, records(), JobHints(mode="sft", samples=1), hinted=[ep])
    assert off.counts["hint_relabelled"] == 0 and off.items[0].action_ids == first.action_ids
    # per family, the items by tool and with the solver's thought: the answer's only, then both
    row = {"successes": 1, "too_long": 0, "capped": 0, "items": 2, "code_exe": 1, "response": 1}
    assert off.by_family == {"numbers": {**row, "solver_thought": 1}}
    assert step.by_family == {"numbers": {**row, "solver_thought": 2}}
    # relabelled before the length check: a reply over the cap as sampled but within it
    # with the (shorter) solver's thought is trained, not dropped as too long
    cap = len(new.action_ids)
    assert cap < len(first.action_ids)
    short = JobHints(mode="sft", samples=1, relabel_thoughts=True, max_reply_tokens=cap)
    kept = hint_step(trainer, records(), short, hinted=[ep])
    assert kept.counts["hint_too_long"] == 0 and kept.counts["hint_relabelled"] == 1
    assert [tok.decode(it.action_ids) for it in kept.items] == [new.text, answer]
    as_sampled = JobHints(mode="sft", samples=1, max_reply_tokens=cap)
    dropped = hint_step(trainer, records(), as_sampled, hinted=[ep])
    assert dropped.counts["hint_too_long"] == 1 and dropped.items == []
