"""Questions with exact answers for the tool-use environment, generated from a seed.

Three families, each solvable with the calculator or a few lines of Python:
  - arithmetic: an integer expression, plainly or as a word problem;
  - data: a small table (CSV, markdown or prose; columns in any order) and a question
    about it (a total, a mean, an arg-max, a count, a median);
  - numbers: a counting/number-theory question that wants a loop (primes, Fibonacci, ...).

Two pools (`pool`): "train" is everything the training generator produces, each kind
worded several ways (`phrasings.TRAIN`); "unseen" asks with wordings, table layouts and
question kinds the training generator never produces (`phrasings.UNSEEN`), the held-out
pool that tells learning the tools from learning the templates. A task carries its
`kind`, its template id (`phrasing`) and a `spec`: what the question says in structured
form (the expression, the table's rows and the order its columns are shown in, the
numbers), never its answer, from which the scripted solver writes its program.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

from agentrl.envs.tooluse import phrasings as ph

FAMILIES = ("arithmetic", "data", "numbers")
POOLS = ("train", "unseen")


@dataclass(frozen=True)
class ToolTask:
    task_id: str
    family: str
    question: str
    answer: int | float | str
    tolerance: float = 1e-6
    candidates: tuple[str, ...] = field(default_factory=tuple)
    """For text answers: the other names the question offers (naming two of them is wrong)."""
    kind: str = ""
    pool: str = "train"
    phrasing: str = ""
    """The id of the question's template (`phrasings.templates`)."""
    spec: dict[str, Any] = field(default_factory=dict, hash=False)


def generate_task(seed: int, family: str = "mixed", pool: str = "train") -> ToolTask:
    if pool not in POOLS:
        raise ValueError(f"unknown tool-use pool {pool!r}: use one of {POOLS}")
    rng = random.Random(seed)
    if family == "mixed":
        family = FAMILIES[rng.randrange(len(FAMILIES))]
    makers = {"arithmetic": _arithmetic, "data": _data, "numbers": _numbers}
    if family not in makers:
        raise ValueError(f"unknown tool-use family {family!r}: use one of {('mixed', *FAMILIES)}")
    prefix = "tooluse" if pool == "train" else "tooluse-unseen"
    return makers[family](rng, f"{prefix}-{family}-{seed}", pool)


# ---- arithmetic ------------------------------------------------------------------------


def _arithmetic(rng: random.Random, task_id: str, pool: str) -> ToolTask:
    a, b, c, d = (rng.randint(12, 999) for _ in range(4))
    m = c // 10 + 2
    shape = rng.randrange(len(ph.ARITHMETIC_SHAPES))
    kind = ph.ARITHMETIC_SHAPES[shape]
    expr, value = _arithmetic_shape(kind, a, b, c, d, m)
    spec = {"expression": expr}
    if pool == "train":
        if rng.random() < 0.3:
            a, b, c, d = _countable(kind, a, b, c, d, m)
            expr, value = _arithmetic_shape(kind, a, b, c, d, m)
            spec = {"expression": expr}
            text = ph.TRAIN_ARITHMETIC_WORD[kind].format(a=a, b=b, c=c, d=d, m=m)
            phrasing = f"train/arithmetic/word/{kind}/0"
        else:
            name = rng.choice(sorted(ph.TRAIN_ARITHMETIC_PLAIN))
            text = ph.TRAIN_ARITHMETIC_PLAIN[name].format(expr=expr)
            phrasing = f"train/arithmetic/plain/{name}/0"
        return ToolTask(task_id, "arithmetic", text, value, kind=kind, phrasing=phrasing,
                        spec=spec)  # fmt: skip
    if rng.random() < 0.4:
        text = ph.UNSEEN_ARITHMETIC_WORDS[kind].format(a=a, b=b, c=c, d=d, m=m)
        return ToolTask(task_id, "arithmetic", text, value, kind=kind, pool="unseen",
                        phrasing=f"unseen/arithmetic/words/{kind}/0", spec=spec)  # fmt: skip
    kind = rng.choice(sorted(ph.UNSEEN_ARITHMETIC_KINDS))
    fields, expr, answer, tol = _unseen_arithmetic(rng, kind)
    text = ph.UNSEEN_ARITHMETIC_KINDS[kind].format(**fields)
    return ToolTask(task_id, "arithmetic", text, answer, tolerance=tol, kind=kind,
                    pool="unseen", phrasing=f"unseen/arithmetic/kind/{kind}/0",
                    spec={"expression": expr})  # fmt: skip


def _arithmetic_shape(kind: str, a: int, b: int, c: int, d: int, m: int) -> tuple[str, int]:
    """The calculator expression of one arithmetic shape and its value."""
    return {
        "sub_mul_add": (f"({a} - {b}) * {c} + {d}", (a - b) * c + d),
        "mul_sub_mul": (f"{a} * {b} - {c} * {d}", a * b - c * d),
        "add_mul_sub": (f"({a} + {b}) * ({c} - {d})", (a + b) * (c - d)),
        "mul_mul_sub": (f"{a} * {b} * {m} - {d}", a * b * m - d),
    }[kind]


def _countable(kind: str, a: int, b: int, c: int, d: int, m: int) -> tuple[int, int, int, int]:
    """The numbers of a word problem reordered so that no count it asks for is negative.

    A warehouse cannot send out more crates than it has, nor a printer spoil more pages than
    it prints: the plain expression may go below zero, the story may not.
    """
    if kind == "sub_mul_add" and a < b:
        return b, a, c, d
    if kind == "mul_sub_mul" and a * b < c * d:
        return c, d, a, b
    if kind == "add_mul_sub" and c < d:
        return a, b, d, c
    if kind == "mul_mul_sub" and a * b * m < d:
        return a, b, c, d % (a * b * m)
    return a, b, c, d


def _unseen_arithmetic(
    rng: random.Random, kind: str
) -> tuple[dict[str, Any], str, int | float, float]:
    """(template fields, a calculator expression of the answer, the answer, tolerance)."""
    if kind == "timesheet_pay":
        days = rng.sample(ph.WEEKDAYS, rng.randint(3, 5))
        worked = [(rng.randint(4, 9), rng.choice((0, 15, 30, 45))) for _ in days]
        rate = rng.randint(1200, 4500) / 100
        shown = ", ".join(f"{day} {h} h {mi} min" for day, (h, mi) in zip(days, worked,
                                                                           strict=True))  # fmt: skip
        hours = "+".join(f"{h}+{mi}/60" for h, mi in worked)
        value = round(sum(h + mi / 60 for h, mi in worked) * rate, 2)
        fields = {"who": rng.choice(ph.NAMES), "days": shown, "rate": f"{rate:.2f}"}
        return fields, f"({hours})*{rate:.2f}", value, 0.011
    if kind == "percent_change":
        price, up, down = rng.randint(100, 2000), rng.randint(5, 40), rng.randint(5, 40)
        value = round(price * (1 + up / 100) * (1 - down / 100), 2)
        expr = f"{price}*(1+{up}/100)*(1-{down}/100)"
        return {"price": price, "up": up, "down": down}, expr, value, 0.011
    if kind == "distance_units":
        laps, track, km = rng.randint(3, 25), rng.choice((200, 250, 400)), rng.randint(2, 21)
        expr = f"{laps}*{track}+{km}*1000"
        return {"laps": laps, "track": track, "km": km}, expr, laps * track + km * 1000, 1e-6
    if kind == "average_scores":
        scores = [rng.randint(40, 100) for _ in range(rng.randint(5, 8))]
        expr = f"({'+'.join(map(str, scores))})/{len(scores)}"
        value = round(sum(scores) / len(scores), 2)
        return {"scores": ", ".join(map(str, scores))}, expr, value, 0.011
    raise ValueError(f"unknown arithmetic kind {kind!r}")


# ---- data tables -----------------------------------------------------------------------

_PRODUCTS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "melon", "peach", "pear",
             "plum", "kiwi", "orange"]  # fmt: skip
_CITIES = ["Oslo", "Lima", "Cairo", "Perth", "Quito", "Delhi", "Tokyo", "Paris", "Accra",
           "Hanoi", "Seoul", "Rome"]  # fmt: skip
_COLUMNS = {"stock": ph.STOCK_COLUMNS, "city": ph.CITY_COLUMNS, "shift": ph.SHIFT_COLUMNS}


def _rows(rng: random.Random, table: str) -> list[tuple[Any, ...]]:
    """Rows in the table's canonical column order; the columns a kind ranks by are
    distinct, so every arg-max/arg-min has one answer."""
    if table == "stock":
        n = rng.randint(6, 9)
        names = rng.sample(_PRODUCTS, n)
        prices = [rng.randint(50, 999) / 100 for _ in range(n)]
        qty = rng.sample(range(1, 41), n)
        return list(zip(names, prices, qty, strict=True))
    if table == "city":
        n = rng.randint(6, 9)
        names = rng.sample(_CITIES, n)
        temps = [x / 10 for x in rng.sample(range(-50, 351), n)]
        rain = [rng.randint(0, 300) for _ in range(n)]
        return list(zip(names, temps, rain, strict=True))
    n = rng.randint(5, 8)
    names = rng.sample(ph.NAMES, n)
    hours = [rng.randint(20, 90) / 2 for _ in range(n)]
    rates = [rng.randint(1200, 4000) / 100 for _ in range(n)]
    return list(zip(names, hours, rates, strict=True))


def _cell(column: str, value: Any) -> str:
    if column in ("price", "rate"):
        return f"{value:.2f}"
    if column in ("temperature_c", "hours"):
        return f"{value:.1f}"
    return str(value)


def _render_table(
    rng: random.Random, table: str, rows: list[tuple[Any, ...]], pool: str
) -> tuple[str, tuple[str, ...]]:
    """(the table as the question shows it, its columns in the order shown: a CSV or
    markdown table's header order, the canonical order for row sentences)."""
    cols = _COLUMNS[table]
    layouts = ["csv", "markdown", "prose"] if pool == "train" else ["csv", "markdown"]
    if pool == "unseen":
        layouts += ["record", "log"] * 2  # mostly layouts training never shows
    if table not in ph.TRAIN_PROSE_ROWS and "prose" in layouts:
        layouts.remove("prose")
    layout = rng.choice(layouts)
    cells = [{c: _cell(c, v) for c, v in zip(cols, row, strict=True)} for row in rows]
    if layout in ("prose", "record", "log"):
        rows_t = {"prose": ph.TRAIN_PROSE_ROWS, "record": ph.UNSEEN_RECORD_ROWS,
                  "log": ph.UNSEEN_LOG_ROWS}[layout][table]  # fmt: skip
        return "\n".join(rows_t.format(**c) for c in cells), tuple(cols)
    order = list(cols)
    rng.shuffle(order)
    if layout == "csv":
        body = "\n".join(",".join(c[k] for k in order) for c in cells)
        text = ",".join(order) + "\n" + body
    else:
        head = "| " + " | ".join(order) + " |\n|" + "---|" * len(order)
        text = head + "\n" + "\n".join("| " + " | ".join(c[k] for k in order) + " |"
                                       for c in cells)  # fmt: skip
    intro = rng.choice(ph.TRAIN_TABLE_INTROS) if pool == "train" else ""
    return (f"{intro}\n{text}" if intro else text), tuple(order)


def _data_answer(kind: str, rows: list[tuple[Any, ...]], threshold: int) -> tuple[Any, float]:
    """(the answer, its tolerance) of a data question over canonical rows."""
    if kind in ("total_value", "timesheet_total"):
        return round(sum(r[1] * r[2] for r in rows), 2), 0.011
    if kind == "largest_value":
        return max(rows, key=lambda r: (r[1] * r[2], r[0]))[0], 0.0
    if kind == "count_qty_gt":
        return sum(r[2] > threshold for r in rows), 1e-6
    if kind == "smallest_quantity":
        return min(rows, key=lambda r: r[2])[0], 0.0
    if kind == "price_range":
        return round(max(r[1] for r in rows) - min(r[1] for r in rows), 2), 0.011
    if kind == "mean_temp":
        return round(sum(r[1] for r in rows) / len(rows), 2), 0.011
    if kind == "coldest":
        return min(rows, key=lambda r: r[1])[0], 0.0
    if kind == "median_rain":
        ordered = sorted(r[2] for r in rows)
        n = len(ordered)
        return (ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2), 1e-6
    if kind == "rain_above":
        return sum(r[2] for r in rows if r[1] > threshold), 1e-6
    raise ValueError(f"unknown data kind {kind!r}")


def _data(rng: random.Random, task_id: str, pool: str) -> ToolTask:
    if pool == "train":
        kind = rng.choice(ph.TRAIN_DATA_KINDS)
        wordings: dict[str, tuple[str, ...]] = ph.TRAIN_DATA_QUESTIONS
    else:  # half the unseen tasks ask a kind training never asks
        pick = ph.UNSEEN_DATA_KINDS if rng.random() < 0.5 else ph.TRAIN_DATA_KINDS
        kind = rng.choice(pick)
        wordings = ph.UNSEEN_DATA_QUESTIONS
    table = ph.DATA_KINDS_OF[kind]
    rows = _rows(rng, table)
    threshold = rng.randint(5, 30) if table == "stock" else rng.randint(5, 25)
    answer, tol = _data_answer(kind, rows, threshold)
    k = rng.randrange(len(wordings[kind]))
    question = wordings[kind][k].format(threshold=threshold)
    shown, columns = _render_table(rng, table, rows, pool)
    text = f"{question}\n\n{shown}" if rng.random() < 0.6 else f"{shown}\n\n{question}"
    names = tuple(str(r[0]) for r in rows) if isinstance(answer, str) else ()
    spec = {"table": table, "rows": rows, "threshold": threshold, "columns": columns}
    return ToolTask(task_id, "data", text, answer, tolerance=max(tol, 1e-6), candidates=names,
                    kind=kind, pool=pool, phrasing=f"{pool}/data/q/{kind}/{k}",
                    spec=spec)  # fmt: skip


# ---- numbers ---------------------------------------------------------------------------


def _is_prime(p: int) -> bool:
    return p >= 2 and all(p % d for d in range(2, math.isqrt(p) + 1))


def _numbers_answer(kind: str, f: dict[str, int]) -> int:
    n = f.get("n", 0)
    if kind == "sum_primes":
        return sum(p for p in range(2, n) if _is_prime(p))
    if kind == "count_primes":
        return sum(1 for p in range(2, n) if _is_prime(p))
    if kind == "count_divisible":
        return sum(1 for k in range(1, n + 1) if k % f["a"] == 0 or k % f["b"] == 0)
    if kind == "fibonacci":
        x, y = 0, 1
        for _ in range(n):
            x, y = y, x + y
        return x
    if kind == "digit_sum_pow2":
        return sum(int(ch) for ch in str(2 ** f["k"]))
    if kind == "sum_squares":
        return sum(k * k for k in range(1, n + 1))
    if kind == "divisor_count":
        return sum(1 for d in range(1, n + 1) if n % d == 0)
    if kind == "collatz_steps":
        steps = 0
        while n != 1:
            n = n // 2 if n % 2 == 0 else 3 * n + 1
            steps += 1
        return steps
    raise ValueError(f"unknown numbers kind {kind!r}")


def _numbers_fields(rng: random.Random, kind: str) -> dict[str, int]:
    if kind == "sum_primes":
        return {"n": rng.randint(100, 2000)}
    if kind == "count_divisible":
        a, b = rng.sample([3, 4, 5, 6, 7, 9, 11, 13], 2)
        return {"n": rng.randint(500, 5000), "a": a, "b": b}
    if kind == "fibonacci":
        return {"n": rng.randint(20, 90)}
    if kind == "digit_sum_pow2":
        return {"k": rng.randint(50, 300)}
    if kind == "count_primes":
        return {"n": rng.randint(100, 5000)}
    if kind == "sum_squares":
        return {"n": rng.randint(20, 500)}
    if kind == "divisor_count":
        return {"n": rng.randint(100, 20000)}
    if kind == "collatz_steps":
        return {"n": rng.randint(10, 5000)}
    raise ValueError(f"unknown numbers kind {kind!r}")


def _numbers(rng: random.Random, task_id: str, pool: str) -> ToolTask:
    if pool == "train":
        kind = rng.choice(ph.TRAIN_NUMBER_KINDS)
        wordings: dict[str, tuple[str, ...]] = ph.TRAIN_NUMBERS
    else:
        pick = ph.UNSEEN_NUMBER_KINDS if rng.random() < 0.5 else ph.TRAIN_NUMBER_KINDS
        kind = rng.choice(pick)
        wordings = ph.UNSEEN_NUMBERS
    fields = _numbers_fields(rng, kind)
    k = rng.randrange(len(wordings[kind]))
    text = wordings[kind][k].format(**fields)
    return ToolTask(task_id, "numbers", text, _numbers_answer(kind, fields), kind=kind,
                    pool=pool, phrasing=f"{pool}/numbers/q/{kind}/{k}",
                    spec=dict(fields))  # fmt: skip


def question_kind(task: ToolTask) -> str:
    """The task's kind within its family ("data: count_qty_gt"). Demonstrations balanced
    across families alone were not balanced across kinds: the first 24 data seeds held no
    "how many" question, and the warm start answered every such question with the
    program of another kind (2026-11-28)."""
    return f"{task.family}: {task.kind}"


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


def distinct_seeds(family: str, n: int, start: int, pool: str = "train") -> list[int]:
    """The first `n` seeds from `start` whose questions differ: a held-out set never holds
    one question twice (a Fibonacci index can repeat by chance in a few dozen seeds)."""
    seen: set[str] = set()
    out: list[int] = []
    seed = start
    while len(out) < n:
        question = generate_task(seed, family, pool).question
        if question not in seen:
            seen.add(question)
            out.append(seed)
        seed += 1
    return out


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
