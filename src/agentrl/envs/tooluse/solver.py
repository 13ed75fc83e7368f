"""Scripted correct solutions of the tool-use tasks, as Agent Zero JSON replies.

Used as demonstrations for a supervised warm start: every reply is what the agent should
write, read off the task's question only (never its answer), and the final answer is
copied from the tool's output, as a model would have to. Arithmetic: `calculator` with the
question's expression. Data: `code_exe` with a short program that embeds the table as it
appears in the question and computes the answer. Numbers: `code_exe` with a short loop.
Then `response` with what the tool showed. `solve_episode` plays a task in the real
environment, so a demonstration is only kept if the environment says it succeeded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agentrl.envs.tooluse.agent_prompt import Turn, reply
from agentrl.envs.tooluse.env import ToolUseEnv
from agentrl.envs.tooluse.tasks import ToolTask

# Short thoughts (the schema caps one at THOUGHT_CHARS): every token is a decode step.
THOUGHT_CALC = "Use the calculator."
THOUGHT_CODE = "Write a Python program."
THOUGHT_ANSWER = "Answer with the tool's result."

_TABLE_HEAD = "R=[l.split(',') for l in t.split()[1:]]\n"


def _table(question: str) -> tuple[str, str]:
    """(the question's first line, its CSV table)."""
    head, _, table = question.partition("\n\n")
    return head, table.strip()


def first_action(task: ToolTask) -> tuple[str, str, str]:
    """(thought, tool, argument) of the first reply: the computation."""
    q = task.question
    if task.family == "arithmetic":
        m = re.fullmatch(r"What is (.+)\? Give the exact integer\.", q)
        if m is None:
            raise ValueError(f"not an arithmetic question: {q!r}")
        return THOUGHT_CALC, "calculator", m.group(1)
    if task.family == "data":
        head, table = _table(q)
        prefix = f"t='''{table}'''\n{_TABLE_HEAD}"
        if head.startswith("What is the total value"):
            last = "print(round(sum(float(r[1])*int(r[2]) for r in R),2))"
        elif head.startswith("Which item has the largest"):
            last = "print(max(R,key=lambda r:(float(r[1])*int(r[2]),r[0]))[0])"
        elif m := re.fullmatch(r"How many items have a quantity greater than (\d+)\?", head):
            last = f"print(sum(int(r[2])>{m.group(1)} for r in R))"
        elif head.startswith("What is the mean temperature_c"):
            last = "print(round(sum(float(r[1]) for r in R)/len(R),2))"
        elif head.startswith("Which city is the coldest"):
            last = "print(min(R,key=lambda r:(float(r[1]),r[0]))[0])"
        elif head.startswith("What is the median rainfall_mm"):
            last = "import statistics\nprint(statistics.median(int(r[2]) for r in R))"
        else:
            raise ValueError(f"unknown data question: {head!r}")
        return THOUGHT_CODE, "code_exe", prefix + last
    if task.family == "numbers":
        if m := re.fullmatch(r"What is the sum of all prime numbers below (\d+)\?", q):
            n = m.group(1)
            code = f"print(sum(p for p in range(2,{n}) if all(p%d for d in range(2,int(p**.5)+1))))"
        elif m := re.fullmatch(
            r"How many integers from 1 to (\d+) \(inclusive\) are divisible by (\d+) or by (\d+)\?",
            q,
        ):
            n, a, b = m.groups()
            code = f"print(sum(1 for k in range(1,{n}+1) if k%{a}==0 or k%{b}==0))"
        elif m := re.fullmatch(
            r"What is Fibonacci number F\((\d+)\), with F\(1\) = F\(2\) = 1\?", q
        ):
            code = f"a,b=0,1\nfor _ in range({m.group(1)}):\n    a,b=b,a+b\nprint(a)"
        elif m := re.fullmatch(r"What is the sum of the decimal digits of 2\*\*(\d+)\?", q):
            code = f"print(sum(int(c) for c in str(2**{m.group(1)})))"
        else:
            raise ValueError(f"unknown numbers question: {q!r}")
        return THOUGHT_CODE, "code_exe", code
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
