"""Scripted correct solutions of the tool-use tasks, as Agent Zero JSON replies.

Used as demonstrations for a supervised warm start: every reply is what the agent should
write, read off what the task's question says (its `spec`: the expression, the table's
rows, the numbers; never its answer), and the final answer is copied from the tool's
output, as a model would have to. Arithmetic: `calculator` with the question's expression
(a word problem's too). Data: `code_exe` with a short program that holds the table's rows
as one Python literal, whatever layout the question used, and computes the answer (two
forms, `DATA_PROGRAMS`; `data_program` picks one). Numbers: `code_exe` with a short loop.
Then `response` with what the tool showed. `solve_episode` plays a task in the real
environment, so a demonstration is only kept if the environment says it succeeded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agentrl.envs.tooluse.agent_prompt import Turn, reply
from agentrl.envs.tooluse.env import ToolUseEnv
from agentrl.envs.tooluse.phrasings import CITY_COLUMNS, SHIFT_COLUMNS, STOCK_COLUMNS
from agentrl.envs.tooluse.tasks import ToolTask, _cell

_CANON_COLUMNS = {tuple(sorted(c)): c for c in (STOCK_COLUMNS, CITY_COLUMNS, SHIFT_COLUMNS)}

# Short thoughts (the schema caps one at THOUGHT_CHARS): every token is a decode step.
THOUGHT_CALC = "Use the calculator."
THOUGHT_CODE = "Write a Python program."
THOUGHT_ANSWER = "Answer with the tool's result."

_DATA_LAST = {  # the last line of each data kind's program; R holds the table's rows
    "total_value": "print(round(sum(r[1]*r[2] for r in R),2))",
    "timesheet_total": "print(round(sum(r[1]*r[2] for r in R),2))",
    "largest_value": "print(max(R,key=lambda r:(r[1]*r[2],r[0]))[0])",
    "count_qty_gt": "print(sum(r[2]>{threshold} for r in R))",
    "smallest_quantity": "print(min(R,key=lambda r:r[2])[0])",
    "price_range": "print(round(max(r[1] for r in R)-min(r[1] for r in R),2))",
    "mean_temp": "print(round(sum(r[1] for r in R)/len(R),2))",
    "coldest": "print(min(R,key=lambda r:r[1])[0])",
    "median_rain": "import statistics\nprint(statistics.median(r[2] for r in R))",
    "rain_above": "print(sum(r[2] for r in R if r[1]>{threshold}))",
}
# The same quantities over the rows as dicts keyed by the table's own column names
# (`data_program="shown"`): the program names what the question names ("price * quantity").
_DATA_LAST_NAMED = {
    "total_value": "print(round(sum(d['price']*d['quantity'] for d in D),2))",
    "timesheet_total": "print(round(sum(d['hours']*d['rate'] for d in D),2))",
    "largest_value": "print(max(D,key=lambda d:(d['price']*d['quantity'],d['item']))['item'])",
    "count_qty_gt": "print(sum(d['quantity']>{threshold} for d in D))",
    "smallest_quantity": "print(min(D,key=lambda d:d['quantity'])['item'])",
    "price_range": "print(round(max(d['price'] for d in D)-min(d['price'] for d in D),2))",
    "mean_temp": "print(round(sum(d['temperature_c'] for d in D)/len(D),2))",
    "coldest": "print(min(D,key=lambda d:d['temperature_c'])['city'])",
    "median_rain": "import statistics\nprint(statistics.median(d['rainfall_mm'] for d in D))",
    "rain_above": "print(sum(d['rainfall_mm'] for d in D if d['temperature_c']>{threshold}))",
}
DATA_PROGRAMS = ("canonical", "shown")
"""How a data program holds the table. "canonical": the rows in the generator's column
order (`R=[(item, price, quantity), ...]`) whatever order the question showed, read by
position. "shown": the header and every cell as the question shows them, in its order
(`C=['quantity','price','item']`, `R=[(9,5.94,'kiwi'), ...]`), read by column name. Issue
52, s33: the light warm start never wrote a right canonical table at temperature 1 (0 of
9 parsable literals of the s32 loop's 41 data episodes; 7 of 65 rows), shuffling values
between columns and rows; "shown" asks for a copy in order instead of a reordering."""
DATA_PROGRAM = "canonical"
"""The form `first_action` writes when not told (what the warm start was trained on)."""

_PRIME = "all(p%d for d in range(2,int(p**.5)+1))"
_NUMBERS_CODE = {
    "sum_primes": "print(sum(p for p in range(2,{n}) if " + _PRIME + "))",
    "count_primes": "print(sum(1 for p in range(2,{n}) if " + _PRIME + "))",
    "count_divisible": "print(sum(1 for k in range(1,{n}+1) if k%{a}==0 or k%{b}==0))",
    "fibonacci": "a,b=0,1\nfor _ in range({n}):\n    a,b=b,a+b\nprint(a)",
    "digit_sum_pow2": "print(sum(int(c) for c in str(2**{k})))",
    "sum_squares": "print(sum(k*k for k in range(1,{n}+1)))",
    "divisor_count": "print(sum(1 for d in range(1,{n}+1) if {n}%d==0))",
    "collatz_steps": "n,s={n},0\nwhile n!=1:\n    n=n//2 if n%2==0 else 3*n+1\n    s+=1\nprint(s)",
}


def table_literal(rows: list[tuple[object, ...]]) -> str:
    """The table's rows as one Python literal, whatever layout the question showed it in
    (CSV, markdown, prose): reading the table is the model's part of the work."""
    return "R=[" + ",".join("(" + ",".join(repr(v) for v in row) + ")" for row in rows) + "]"


def shown_table_literal(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """The header and the rows as the question shows them (`columns` in the order shown,
    each cell as printed: "0.80", not 0.8), then the rows as dicts by column name."""
    canon = {name: i for i, name in enumerate(_CANON_COLUMNS[tuple(sorted(columns))])}
    head = "C=[" + ",".join(repr(c) for c in columns) + "]"
    cells = ["(" + ",".join(_shown_cell(c, row[canon[c]]) for c in columns) + ")" for row in rows]
    return head + "\nR=[" + ",".join(cells) + "]\nD=[dict(zip(C,r)) for r in R]"


def _shown_cell(column: str, value: object) -> str:
    text = _cell(column, value)
    return repr(text) if isinstance(value, str) else text


def data_program(task: ToolTask, form: str | None = None) -> str:
    """The program of a data task in `form` (`DATA_PROGRAMS`; None: `DATA_PROGRAM`)."""
    form = DATA_PROGRAM if form is None else form
    if form not in DATA_PROGRAMS:
        raise ValueError(f"unknown data program form {form!r}: use one of {DATA_PROGRAMS}")
    spec = task.spec
    if task.kind not in _DATA_LAST:
        raise ValueError(f"unknown data question kind {task.kind!r}")
    if form == "canonical" or "columns" not in spec:
        last = _DATA_LAST[task.kind].format(threshold=spec.get("threshold"))
        return table_literal(spec["rows"]) + "\n" + last
    last = _DATA_LAST_NAMED[task.kind].format(threshold=spec.get("threshold"))
    return shown_table_literal(spec["columns"], spec["rows"]) + "\n" + last


def first_action(task: ToolTask, data_form: str | None = None) -> tuple[str, str, str]:
    """(thought, tool, argument) of the first reply: the computation, written from what
    the question says (`task.spec`), never from its answer; a data program in `data_form`
    (`data_program`)."""
    spec = task.spec
    if not spec:
        raise ValueError(f"task {task.task_id!r} has no spec to solve it from")
    if task.family == "arithmetic":
        return THOUGHT_CALC, "calculator", str(spec["expression"])
    if task.family == "data":
        return THOUGHT_CODE, "code_exe", data_program(task, data_form)
    if task.family == "numbers":
        if task.kind not in _NUMBERS_CODE:
            raise ValueError(f"unknown numbers question kind {task.kind!r}")
        return THOUGHT_CODE, "code_exe", _NUMBERS_CODE[task.kind].format(**spec)
    raise ValueError(f"unknown family {task.family!r}")


def answer_from(result: str) -> str:
    """The final answer a tool's output shows: the value after '=' for the calculator, the
    last printed line for code_exe."""
    if result.startswith("calculator:"):
        return result.split("\n", 1)[0].rsplit("=", 1)[-1].strip()
    if "stdout:\n" in result:
        out = result.split("stdout:\n", 1)[1].split("\n(Steps left", 1)[0]
        out = out.split("\nstderr:", 1)[0]
        lines = [line.strip() for line in out.strip().splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return result.strip().split("\n", 1)[0]


def first_reply(task: ToolTask, data_form: str | None = None) -> str:
    thought, tool, arg = first_action(task, data_form)
    key = "expression" if tool == "calculator" else "code"
    return reply(thought, tool, **{key: arg})


def answer_reply(result: str) -> str:
    return reply(THOUGHT_ANSWER, "response", text=answer_from(result))


@dataclass
class SolvedEpisode:
    """A scripted episode as the environment played it."""

    seed: int
    task: ToolTask
    turns: list[Turn] = field(default_factory=list)
    success: bool = False


def solve_episode(env: ToolUseEnv, seed: int, data_form: str | None = None) -> SolvedEpisode:
    """Play the scripted solution of `seed`'s task in `env` (a data program in
    `data_form`, `data_program`); `success` is the env's verdict."""
    env.reset(seed)
    assert env.task is not None
    task = env.task
    first = first_reply(task, data_form)
    tool = first_action(task, data_form)[1]
    obs, _, done, info = env.step(first)
    episode = SolvedEpisode(seed, task, [Turn(first, str(obs["text"]), tool)])
    if done:
        return episode
    last = answer_reply(str(obs["text"]))
    _, _, _, info = env.step(last)
    episode.turns.append(Turn(last, None, "response"))
    episode.success = bool(info.get("success"))
    return episode
