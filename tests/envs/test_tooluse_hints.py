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
