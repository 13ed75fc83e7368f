"""Scripted correct solutions of the tool-use tasks, as Agent Zero JSON replies.

Used as demonstrations for a supervised warm start: every reply is what the agent should
write, read off what the task's question says (its `spec`: the expression, the table's
rows, the numbers; never its answer), and the final answer is copied from the tool's
output, as a model would have to. Arithmetic: `calculator` with the question's expression
(a word problem's too). Data: `code_exe` with a short program that holds the table's rows
as one Python literal, whatever layout the question used, and computes the answer.
Numbers: `code_exe` with a short loop.
Then `response` with what the tool showed. `solve_episode` plays a task in the real
environment, so a demonstration is only kept if the environment says it succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrl.envs.tooluse.agent_prompt import Turn, reply
from agentrl.envs.tooluse.env import ToolUseEnv
from agentrl.envs.tooluse.tasks import ToolTask

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


def first_action(task: ToolTask) -> tuple[str, str, str]:
    """(thought, tool, argument) of the first reply: the computation, written from what
    the question says (`task.spec`), never from its answer."""
    spec = task.spec
    if not spec:
        raise ValueError(f"task {task.task_id!r} has no spec to solve it from")
    if task.family == "arithmetic":
        return THOUGHT_CALC, "calculator", str(spec["expression"])
    if task.family == "data":
        if task.kind not in _DATA_LAST:
            raise ValueError(f"unknown data question kind {task.kind!r}")
        last = _DATA_LAST[task.kind].format(threshold=spec.get("threshold"))
        return THOUGHT_CODE, "code_exe", table_literal(spec["rows"]) + "\n" + last
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


def first_reply(task: ToolTask) -> str:
    thought, tool, arg = first_action(task)
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


def solve_episode(env: ToolUseEnv, seed: int) -> SolvedEpisode:
    """Play the scripted solution of `seed`'s task in `env`; `success` is the env's verdict."""
    env.reset(seed)
    assert env.task is not None
    task = env.task
    first = first_reply(task)
    tool = first_action(task)[1]
    obs, _, done, info = env.step(first)
    episode = SolvedEpisode(seed, task, [Turn(first, str(obs["text"]), tool)])
    if done:
        return episode
    last = answer_reply(str(obs["text"]))
    _, _, _, info = env.step(last)
    episode.turns.append(Turn(last, None, "response"))
    episode.success = bool(info.get("success"))
    return episode
