"""What the environment's checker can tell an agent after it failed a task: what was wrong
with its attempts, and what the task needs. A learner puts this (or a user's correction)
in the context of a task whose samples all failed and samples again (issue 52, "hints where
every sample failed"); the hint never enters the prompt it then trains.

Levels: by default the hint says what was wrong, the quantity the task needs, and the first
call to make (the tool, its argument: the expression, or a program that holds the table's
rows and computes the quantity: `call_shape`), never the answer; `plan=False` says the quantity and
the tool in words only; `reveal_answer=True` adds the answer itself. Each is measured apart
(`python -m agentrl.bench.tooluse_hints measure`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.envs.tooluse.tasks import ToolTask, check_answer

HINT_PREFIX = "Hint: "

_NEEDS = {  # data and numbers kinds: what the answer is, in the checker's words
    "total_value": "the sum over all rows of price times quantity, rounded to 2 decimals",
    "timesheet_total": "the sum over all rows of hours times rate, rounded to 2 decimals",
    "largest_value": "the name of the row whose price times quantity is the largest",
    "count_qty_gt": "how many rows have a quantity greater than {threshold}",
    "smallest_quantity": "the name of the row with the smallest quantity",
    "price_range": "the largest price minus the smallest price, rounded to 2 decimals",
    "mean_temp": "the mean of the temperature column, rounded to 2 decimals",
    "coldest": "the name of the row with the lowest temperature",
    "median_rain": "the median of the rainfall column",
    "rain_above": "the sum of the rainfall of the rows warmer than {threshold}",
    "sum_primes": "the sum of the primes below {n}",
    "count_primes": "how many primes are below {n}",
    "count_divisible": "how many of 1..{n} are divisible by {a} or by {b}",
    "fibonacci": "F({n}) of the Fibonacci sequence with F(1) = F(2) = 1",
    "digit_sum_pow2": "the sum of the decimal digits of 2**{k}",
    "sum_squares": "the sum of k*k for k from 1 to {n}",
    "divisor_count": "the number of divisors of {n}",
    "collatz_steps": "the number of Collatz steps from {n} down to 1",
}


@dataclass(frozen=True)
class Attempt:
    """One failed episode, as the checker saw it."""

    answer: str | None = None  # the `response` text, None when none was given
    tools: tuple[str, ...] = ()  # the tools called before it (calculator, code_exe)
    tool_error: bool = False  # a tool call failed (a calculator error, a traceback)
    cut_by_token_cap: bool = False  # a reply ran into the token cap


def what_was_wrong(task: ToolTask, attempts: Sequence[Attempt]) -> str:
    """The checker's verdict on the attempts, most common failure first; never the answer."""
    notes: list[str] = []
    answers = [a.answer for a in attempts if a.answer is not None]
    wrong = [x for x in answers if not check_answer(x, task)]
    if wrong:
        shown = ", ".join(sorted({repr(x[:30]) for x in wrong})[:3])
        notes.append(f"the final answers {shown} are not correct")
        if isinstance(task.answer, str) and any(_is_number(x) for x in wrong):
            notes.append("the answer is a name, not a number")
        if not isinstance(task.answer, str) and all(not _has_digit(x) for x in wrong):
            notes.append("the answer is a number")
    if len(answers) < len(attempts):
        notes.append("some attempts never gave a final answer with the response tool")
    if any(a.cut_by_token_cap for a in attempts):
        notes.append("a reply was too long and was cut off; keep the thought short")
    if any(a.tool_error for a in attempts):
        notes.append("a tool call failed")
    if any(not a.tools for a in attempts if a.answer is not None):
        notes.append("an answer was given without computing it with a tool first")
    return "; ".join(notes) if notes else "the attempts did not solve the task"


def quantity(task: ToolTask) -> str | None:
    """The quantity the question asks for, in the checker's words (None: unknown kind)."""
    spec = task.spec
    if task.family == "arithmetic" and "expression" in spec:
        return f"the value of {spec['expression']}"
    need = _NEEDS.get(task.kind)
    return None if need is None else need.format(**{k: v for k, v in spec.items() if k != "rows"})


def what_the_task_needs(task: ToolTask) -> str:
    """The quantity asked for and how to get it, from the task's spec (not its answer)."""
    need = quantity(task)
    if task.family == "arithmetic" and "expression" in task.spec:
        return f"{need}: use the calculator with that expression"
    if need is None:
        return "compute the answer with a tool, then give it with the response tool"
    if task.family == "data":
        return (
            f"{need}; use code_exe with a program that holds the table's rows in a list "
            "and prints the result"
        )
    return f"{need}; use code_exe with a short program that prints it"


def call_shape(task: ToolTask, data_form: str | None = None) -> str:
    """The first call to make, as the exact reply the model writes (thought first: the
    light warm start picks its tool from its thought, and with only the call's JSON in the
    hint it ran the right program in the calculator): the scripted solver's first reply,
    written from what the question shows (`solver.first_action`: the expression, the
    table's rows as a Python literal in a fixed column order, the loop), never from the
    answer, which only running the call shows. With a placeholder for the rows
    (`R=[(item, price, quantity), ...]`) the model copied the placeholder verbatim; with
    "then reply with response and the value the tool printed" after the call it wrote the
    response's thought and, for 4 of 6 numbers tasks, sent the program as its answer.

    Numbers too: its program in plain text made the light warm start call the calculator
    (0 of 7 failed training tasks solved), the reply's JSON 2 of 7 (docs/bench/2026-11.md,
    "Hints", s29). A data program in `data_form` (`solver.data_program`)."""
    from agentrl.envs.tooluse.solver import first_reply

    try:
        call = first_reply(task, data_form)
    except (ValueError, KeyError):
        return ""
    return f"Reply with {call}"


def hint_for(
    task: ToolTask,
    attempts: Sequence[Attempt] = (),
    *,
    reveal_answer: bool = False,
    correction: str | None = None,
    plan: bool = True,
    data_form: str | None = None,
) -> str:
    """The hint for a task whose samples all failed. A user's `correction` (free text sent
    with feedback) takes the place of what the environment says the task needs, since in
    production a user's words are all there is; the checker's verdict stays beside it.
    `plan` (the default) adds the shape of the first call (`call_shape`); without it the
    hint says the quantity and the tool in words only (measured apart: bench
    tooluse_hints, levels "checker" and "plan"); a data task's call writes its program in
    `data_form` (`solver.data_program`)."""
    parts = []
    if attempts:
        parts.append(f"Earlier attempts failed: {what_was_wrong(task, attempts)}.")
    if correction and correction.strip():
        parts.append(f"A user's correction: {correction.strip()}")
    elif plan and (shape := call_shape(task, data_form)):  # the quantity, then the call's shape
        parts.append(f"The task needs {quantity(task)}. {shape}")
    else:
        parts.append(f"The task needs {what_the_task_needs(task)}.")
    if reveal_answer:
        parts.append(f"The right answer is {task.answer}.")
    return HINT_PREFIX + " ".join(parts)


def with_hint(question: str, hint: str | None) -> str:
    """The user message with the hint after the question (None: the question alone)."""
    return question if not hint else f"{question}\n\n{hint}"


def _has_digit(text: str) -> bool:
    return any(ch.isdigit() for ch in text)


def _is_number(text: str) -> bool:
    try:
        float(text.strip().replace(",", ""))
    except ValueError:
        return False
    return True
