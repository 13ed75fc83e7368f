"""What the tool-use checker tells a learner after every sample of a task failed: what was
wrong and what the task needs, never the answer unless asked; a user's correction takes
the place of what the environment says the task needs."""

from __future__ import annotations

import pytest

from agentrl.envs.tooluse.hints import Attempt, hint_for, what_was_wrong, with_hint
from agentrl.envs.tooluse.tasks import FAMILIES, generate_task

SEEDS = range(1_000_000, 1_000_040)


@pytest.mark.parametrize("pool", ["train", "unseen"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_hint_never_gives_the_answer_unless_asked(family: str, pool: str) -> None:
    for seed in SEEDS:
        task = generate_task(seed, family, pool)
        tries = [Attempt(answer="12345.5", tools=("calculator",)), Attempt(answer=None)]
        hint = hint_for(task, tries)
        assert hint.startswith("Hint: ") and "not correct" in hint and "never gave" in hint
        truth = str(task.answer)
        if len(truth) >= 3 and truth not in task.question:  # a value the hint could leak
            assert truth not in hint, (task.question, hint)
        assert truth in hint_for(task, tries, reveal_answer=True)


def test_the_checker_says_what_was_wrong() -> None:
    data = next(t for s in SEEDS if isinstance((t := generate_task(s, "data")).answer, str))
    said = what_was_wrong(data, [Attempt(answer="42", tools=("code_exe",))])
    assert "a name, not a number" in said
    num = generate_task(1_000_000, "numbers")
    said = what_was_wrong(num, [Attempt(answer="Oslo", tools=()), Attempt(cut_by_token_cap=True)])
    assert "the answer is a number" in said and "cut off" in said
    assert "without computing it with a tool" in said


def test_a_users_correction_is_the_hint_and_the_question_comes_first() -> None:
    task = generate_task(1_000_001, "data")
    hint = hint_for(task, [Attempt(answer="3")], correction="  no - read the CSV first ")
    assert "A user's correction: no - read the CSV first" in hint
    assert "The task needs" not in hint
    assert "The task needs" in hint_for(task, [], correction="   ")  # blank: the env's words
    assert with_hint("Q?", hint) == f"Q?\n\n{hint}" and with_hint("Q?", None) == "Q?"


def _planned_call(hint: str) -> dict:  # type: ignore[type-arg]
    """The call the plan hint asks for: the JSON after "Reply with "."""
    import json

    call, _ = json.JSONDecoder().raw_decode(hint.split("Reply with ", 1)[1])
    return dict(call)


def test_every_familys_plan_is_the_solvers_reply_numbers_included() -> None:
    """Numbers' plan is the solver's reply JSON too, last in the hint (its program in plain
    text made the light warm start call the calculator: greedy 0 of 7 failed training
    tasks, against 2 of 7 with the JSON); the plan never names the response tool (with
    "then reply with response" the start sent the program as its answer)."""
    from agentrl.envs.tooluse.solver import THOUGHT_CODE, first_action, first_reply

    for seed in range(1_000_000, 1_000_010):
        task = generate_task(seed, "numbers")
        hint = hint_for(task, [Attempt(answer="0")])
        assert hint.endswith(f"Reply with {first_reply(task)}")
        call = _planned_call(hint)
        assert call["thoughts"] == [THOUGHT_CODE] and call["tool_name"] == "code_exe"
        assert call["tool_args"] == {"code": first_action(task)[2]}
        assert "response" not in hint.split("The task needs", 1)[1]
        assert "Run this program" not in hint
        for family in ("arithmetic", "data"):
            other = hint_for(generate_task(seed, family), [Attempt(answer="0")])
            assert "Reply with {" in other


@pytest.mark.parametrize("pool", ["train", "unseen"])
@pytest.mark.parametrize("family", FAMILIES)
def test_following_the_plan_hint_solves_the_task_and_it_never_holds_the_answer(
    family: str, pool: str
) -> None:
    """The plan is the first reply to write, thought first (the warm start picks its tool
    from its thought); copying it and answering with what the tool printed solves the
    task in the real environment, and the answer is never in the hint."""
    from agentrl.envs.tooluse import ToolUseEnv
    from agentrl.envs.tooluse.agent_prompt import reply
    from agentrl.envs.tooluse.solver import answer_from

    env = ToolUseEnv(family=family, max_steps=4, pool=pool)
    for seed in range(1_000_000, 1_000_008):
        task = generate_task(seed, family, pool)
        hint = hint_for(task, [Attempt(answer="7")])
        truth = str(task.answer)
        if len(truth) >= 3 and truth not in task.question:
            assert truth not in hint, hint
        call = _planned_call(hint)
        assert list(call)[:2] == ["thoughts", "tool_name"]
        env.reset(seed)
        obs, _, done, info = env.step(reply(call["thoughts"][0], call["tool_name"],
                                            **call["tool_args"]))  # fmt: skip
        assert not done and not info.get("tool_error"), obs["text"]
        _, _, done, info = env.step(reply("t", "response", text=answer_from(str(obs["text"]))))
        assert done and info["success"], (hint, obs["text"])


def test_the_plan_hint_is_shorter_than_the_checker_hint_plus_its_call() -> None:
    """With the plan the tool sentence of the needs is left out (one way to say it)."""
    task = generate_task(1_000_002, "data")
    plain, plan = hint_for(task, [], plan=False), hint_for(task, [])
    assert "use code_exe with a program" in plain and "use code_exe with a program" not in plan
    assert plan.count("code_exe") == 1


def test_the_bench_levels_say_what_they_claim() -> None:
    """`bench tooluse_hints` levels: only "answer" gives the answer; "plan" adds the call's
    shape to "checker"; "correction" puts the user's words in place of the needs."""
    from agentrl.bench.tooluse_hints import CORRECTIONS, LEVELS, hint_of

    for seed in range(1_000_000, 1_000_010):
        task = generate_task(seed, "numbers")
        tries = [Attempt(answer="1", tools=("code_exe",))]
        got = {lv: hint_of(lv, task, tries) for lv in LEVELS}
        assert got["none"] is None
        truth = str(task.answer)
        for lv in ("checker", "plan", "correction"):
            if len(truth) >= 3 and truth not in task.question:
                assert truth not in str(got[lv]), (lv, got[lv])
        assert f"The right answer is {truth}." in str(got["answer"])
        assert "Reply with" not in str(got["checker"])
        assert "Reply with {" in str(got["plan"])
        assert CORRECTIONS["numbers"] in str(got["correction"])


def test_a_data_hints_call_is_written_in_the_form_asked() -> None:
    """`hint_for(data_form="shown")` (issue 52, s33): the plan's program copies the table
    as the question shows it (header and cells in its order), never the answer; without a
    form it is the solver's default, the canonical one the warm start learned."""
    from agentrl.envs.tooluse.solver import data_program, first_reply

    for seed in SEEDS:
        task = generate_task(seed, "data")
        hint = hint_for(task, [Attempt(answer="3")], data_form="shown")
        assert hint.endswith(f"Reply with {first_reply(task, 'shown')}")
        assert _planned_call(hint)["tool_args"] == {"code": data_program(task, "shown")}
        assert "C=[" in hint and "d['" in hint
        assert hint_for(task, [Attempt(answer="3")]).endswith(
            f"Reply with {first_reply(task, 'canonical')}"
        )
        truth = str(task.answer)
        if len(truth) >= 3 and truth not in task.question:
            assert truth not in hint
