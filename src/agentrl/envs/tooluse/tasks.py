"""Questions with exact answers for the tool-use environment, generated from a seed.

Three families, each solvable with the calculator or a few lines of Python:
  - arithmetic: an integer expression ("What is (418 - 37) * 26 + 905?");
  - data: a small table and a question about it (a total, a mean, an arg-max, a count);
  - numbers: a counting/number-theory question that wants a loop (primes, Fibonacci, ...).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

FAMILIES = ("arithmetic", "data", "numbers")


@dataclass(frozen=True)
class ToolTask:
    task_id: str
    family: str
    question: str
    answer: int | float | str
    tolerance: float = 1e-6
    candidates: tuple[str, ...] = field(default_factory=tuple)
    """For text answers: the other names the question offers (naming two of them is wrong)."""


def generate_task(seed: int, family: str = "mixed") -> ToolTask:
    rng = random.Random(seed)
    if family == "mixed":
        family = FAMILIES[rng.randrange(len(FAMILIES))]
    makers = {"arithmetic": _arithmetic, "data": _data, "numbers": _numbers}
    if family not in makers:
        raise ValueError(f"unknown tool-use family {family!r}: use one of {('mixed', *FAMILIES)}")
    return makers[family](rng, f"tooluse-{family}-{seed}")


def _arithmetic(rng: random.Random, task_id: str) -> ToolTask:
    a, b, c, d = (rng.randint(12, 999) for _ in range(4))
    shapes = [
        (f"({a} - {b}) * {c} + {d}", (a - b) * c + d),
        (f"{a} * {b} - {c} * {d}", a * b - c * d),
        (f"({a} + {b}) * ({c} - {d})", (a + b) * (c - d)),
        (f"{a} * {b} * {c // 10 + 2} - {d}", a * b * (c // 10 + 2) - d),
    ]
    expr, value = shapes[rng.randrange(len(shapes))]
    return ToolTask(task_id, "arithmetic", f"What is {expr}? Give the exact integer.", value)


_PRODUCTS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "melon", "peach", "pear",
             "plum", "kiwi", "orange"]  # fmt: skip
_CITIES = ["Oslo", "Lima", "Cairo", "Perth", "Quito", "Delhi", "Tokyo", "Paris", "Accra",
           "Hanoi", "Seoul", "Rome"]  # fmt: skip


def _data(rng: random.Random, task_id: str) -> ToolTask:
    n = rng.randint(6, 9)
    if rng.random() < 0.5:
        names = rng.sample(_PRODUCTS, n)
        prices = [rng.randint(50, 999) / 100 for _ in range(n)]
        qty = [rng.randint(1, 40) for _ in range(n)]
        table = "item,price,quantity\n" + "\n".join(
            f"{x},{p:.2f},{q}" for x, p, q in zip(names, prices, qty, strict=True)
        )
        kind = rng.randrange(3)
        if kind == 0:
            total = round(sum(p * q for p, q in zip(prices, qty, strict=True)), 2)
            question = "What is the total value (sum of price * quantity) of the stock? Round to 2 decimals."
            return ToolTask(task_id, "data", f"{question}\n\n{table}", total, tolerance=0.011)
        if kind == 1:
            best = max(range(n), key=lambda i: (prices[i] * qty[i], names[i]))
            question = (
                "Which item has the largest stock value (price * quantity)? Answer with its name."
            )
            return ToolTask(task_id, "data", f"{question}\n\n{table}", names[best],
                            candidates=tuple(names))  # fmt: skip
        threshold = rng.randint(5, 30)
        count = sum(q > threshold for q in qty)
        question = f"How many items have a quantity greater than {threshold}?"
        return ToolTask(task_id, "data", f"{question}\n\n{table}", count)
    names = rng.sample(_CITIES, n)
    temps = [round(rng.uniform(-5, 35), 1) for _ in range(n)]
    rain = [rng.randint(0, 300) for _ in range(n)]
    table = "city,temperature_c,rainfall_mm\n" + "\n".join(
        f"{x},{t:.1f},{r}" for x, t, r in zip(names, temps, rain, strict=True)
    )
    kind = rng.randrange(3)
    if kind == 0:
        mean = round(sum(temps) / n, 2)
        question = "What is the mean temperature_c over all cities? Round to 2 decimals."
        return ToolTask(task_id, "data", f"{question}\n\n{table}", mean, tolerance=0.011)
    if kind == 1:
        coldest = min(range(n), key=lambda i: (temps[i], names[i]))
        question = "Which city is the coldest? Answer with its name."
        return ToolTask(task_id, "data", f"{question}\n\n{table}", names[coldest],
                        candidates=tuple(names))  # fmt: skip
    ordered = sorted(rain)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    question = "What is the median rainfall_mm?"
    return ToolTask(task_id, "data", f"{question}\n\n{table}", median, tolerance=1e-6)


def _numbers(rng: random.Random, task_id: str) -> ToolTask:
    kind = rng.randrange(4)
    if kind == 0:
        n = rng.randint(100, 2000)
        value = sum(p for p in range(2, n) if all(p % d for d in range(2, math.isqrt(p) + 1)))
        return ToolTask(
            task_id, "numbers", f"What is the sum of all prime numbers below {n}?", value
        )
    if kind == 1:
        n = rng.randint(500, 5000)
        a, b = rng.sample([3, 4, 5, 6, 7, 9, 11, 13], 2)
        value = sum(1 for k in range(1, n + 1) if k % a == 0 or k % b == 0)
        question = f"How many integers from 1 to {n} (inclusive) are divisible by {a} or by {b}?"
        return ToolTask(task_id, "numbers", question, value)
    if kind == 2:
        n = rng.randint(20, 60)
        x, y = 0, 1
        for _ in range(n):
            x, y = y, x + y
        question = f"What is Fibonacci number F({n}), with F(1) = F(2) = 1?"
        return ToolTask(task_id, "numbers", question, x)
    k = rng.randint(50, 200)
    value = sum(int(ch) for ch in str(2**k))
    return ToolTask(task_id, "numbers", f"What is the sum of the decimal digits of 2**{k}?", value)


def question_kind(task: ToolTask) -> str:
    """The task's kind within its family: the question's first line with every number
    replaced by N ("How many items have a quantity greater than N?"). Demonstrations
    balanced across families alone were not balanced across kinds: the first 24 data seeds
    hold no "how many" question, and the warm start answered every such question with the
    program of another kind (2026-11-28)."""
    head = task.question.partition("\n\n")[0]
    return f"{task.family}: " + re.sub(r"\d+", "N", head)


def seeds_by_kind(family: str, n: int, start: int = 0, limit: int = 100_000) -> list[int]:
    """`n` seeds of `family` from `start` up, taking the kinds in turn, so each kind is
    covered as evenly as `n` allows (the smallest seed of each kind first)."""
    pools: dict[str, list[int]] = {}
    seed = start
    while sum(len(p) for p in pools.values()) < 8 * n + 64 and seed < start + limit:
        pools.setdefault(question_kind(generate_task(seed, family)), []).append(seed)
        seed += 1
    queues = [pools[k] for k in sorted(pools)]
    out: list[int] = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    if len(out) < n:
        raise ValueError(f"fewer than {n} {family} seeds in [{start}, {start + limit})")
    return sorted(out)


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def _numbers_in(text: str) -> list[float]:
    out = []
    for m in _NUMBER.finditer(text):
        token = m.group(0)
        if "," in token and not re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", token):
            token = token.split(",")[0]  # "3,4" is a list, not a number
        try:
            out.append(float(token.replace(",", "")))
        except ValueError:
            continue
    return out


def _normalise(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def check_answer(answer: Any, task: ToolTask) -> bool:
    """Is `answer` (the `response` tool's text) the task's answer?

    Numbers: the answer's last number (or the whole text, if it is one number) equals the
    truth within the task's tolerance. Names: the normalised text is the name, or names it
    and no other candidate.
    """
    text = str(answer).strip()
    if isinstance(task.answer, str):
        norm, truth = _normalise(text), _normalise(task.answer)
        if norm == truth:
            return True
        words = f" {norm} "
        named = [c for c in task.candidates if f" {_normalise(c)} " in words]
        return named == [task.answer] or (not task.candidates and f" {truth} " in words)
    numbers = _numbers_in(text)
    if not numbers:
        return False
    value = numbers[-1]
    truth_f = float(task.answer)
    tol = max(task.tolerance, 1e-9 * abs(truth_f))
    return abs(value - truth_f) <= tol
