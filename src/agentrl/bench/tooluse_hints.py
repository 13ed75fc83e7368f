"""Do hints teach? (issue 52, "hints where every sample failed"). Two measurements from a
tool-use start (the light warm start):

  - `measure`: held-out tasks of the hinted families played hint-free, then again with
    each hint level in context (`LEVELS`), greedy and/or at T=1; success per family and
    level with Wilson 95 % intervals, overall and on the tasks the hint-free attempt failed;
  - `compare`: one job's worth of hint items from the same failed attempts (training seeds
    played hint-free at T=1), trained each way (`importance`, `distill`) from the same
    start, and greedy held-out success before/after per family.

Every line printed is one JSON object (the figures BENCHMARKS quotes).
`python -m agentrl.bench.tooluse_hints measure --start DIR --families data numbers --n 30`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# What each level puts after the question. None of them gives the answer but "answer".
LEVELS = {
    "none": "no hint: the question alone",
    "checker": "what was wrong with the hint-free attempt + the quantity the task needs and "
    "the tool for it, in words (hint_for plan=False, the default before the plan)",
    "plan": "checker's verdict + the quantity + the first reply to write, thought first "
    "(the solver's call from what the question shows, as its reply's JSON; "
    "hint_for's default)",
    "answer": "plan + 'The right answer is ...' (reveal_answer=True)",
    "correction": "what was wrong + a short user-style correction in place of the needs",
}
CORRECTIONS = {  # what a user types into "what should it have done?"
    "arithmetic": "use the calculator on the expression first",
    "data": "read the table with code_exe first, then answer",
    "numbers": "write a short Python loop with code_exe and print the result",
}


def hint_of(level: str, task: Any, attempts: Sequence[Any]) -> str | None:
    """The hint a level puts in context for a task (None: hint-free)."""
    from agentrl.envs.tooluse.hints import hint_for

    if level == "none":
        return None
    if level == "correction":
        return hint_for(task, attempts, correction=CORRECTIONS[task.family], plan=False)
    return hint_for(
        task, attempts, reveal_answer=level == "answer", plan=level in ("plan", "answer")
    )


def episode_json(ep: Any, level: str, temperature: float) -> str:
    """One played episode for the record (what the model wrote under which hint)."""
    return json.dumps({
        "level": level, "temperature": temperature, "family": ep.family, "seed": ep.seed,
        "success": ep.success, "hint": ep.hint,
        "turns": [{"reply": t.text, "result": t.result, "finish": t.finish} for t in ep.turns],
    })  # fmt: skip


def _learner(start: str, batch_size: int, seed: int = 0) -> Any:
    from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner

    cfg = ToolUseConfig(
        model=start, max_steps=4, max_new_tokens=256, structured=True, threads=0,
        batch_size=batch_size, seed=seed, out_dir="/tmp/agentrl-bench-tooluse-hints",
        hints="importance",
    )  # fmt: skip
    return ToolUseLearner(cfg)


def rate(successes: int, n: int) -> dict[str, Any]:
    from agentrl.learners.tooluse_episodes import wilson

    lo, hi = wilson(successes, n)
    return {
        "successes": successes,
        "n": n,
        "success": round(successes / n, 3) if n else None,
        "ci": [round(lo, 3), round(hi, 3)],
    }


def heldout(families: Sequence[str], n: int, skip: int = 0) -> list[tuple[str, int]]:
    """`n` held-out tasks a family after the first `skip` (runs that add tasks to a set)."""
    from agentrl.envs.tooluse.tasks import distinct_seeds
    from agentrl.learners.tooluse import HELDOUT_OFFSET

    return [(f, s) for f in families for s in distinct_seeds(f, skip + n, HELDOUT_OFFSET)[skip:]]


def measure(
    start: str, families: Sequence[str], n: int, levels: Sequence[str], temps: Sequence[float],
    batch_size: int, emit: Any, dump: Path | None = None, skip: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """Hint-free first (its attempts feed the checker's verdict), then each hinted level
    (one batched play a level: figures as soon as each is done on a slow host)."""
    from agentrl.envs.tooluse.tasks import generate_task
    from agentrl.learners.tooluse_hints import attempts_of

    learner = _learner(start, batch_size)
    tasks = heldout(families, n, skip)
    out: dict[str, Any] = {}
    for temp in temps:
        plain: list[Any] = []
        for lv in ["none", *[lv for lv in levels if lv != "none"]]:  # one play a level:
            t0 = time.perf_counter()  # its figures come out as soon as it is done
            if lv == "none":
                eps = plain = learner.play(tasks, temp)
            else:
                hints = [
                    hint_of(lv, generate_task(key[1], key[0]), attempts_of([ep]))
                    for key, ep in zip(tasks, plain, strict=True)
                ]
                eps = learner.play(tasks, temp, hints=hints)
            failed = {(ep.family, ep.seed) for ep in plain if not ep.success}
            for fam in families:
                mine = [e for e in eps if e.family == fam]
                on_failed = [e for e in mine if (e.family, e.seed) in failed]
                row = {
                    "bench": "tooluse-hints", "part": "measure", "start": start,
                    "temperature": temp, "family": fam, "level": lv,
                    **rate(sum(e.success for e in mine), len(mine)),
                    "on_failed": rate(sum(e.success for e in on_failed), len(on_failed)),
                    "answered": sum(e.answered for e in mine),
                    "answer_in_result": sum(e.answer_in_result for e in mine),
                    "cut_by_token_cap": sum(t.finish == "length" for e in mine for t in e.turns),
                    "hint_chars_mean": round(
                        sum(len(e.hint or "") for e in mine) / max(1, len(mine)), 1),
                    "wall_s": round(time.perf_counter() - t0, 1),
                }  # fmt: skip
                emit(row)
                out[f"{temp}/{lv}/{fam}"] = row
            ex = next((e for e in eps if e.hint and e.family == "data"), None)
            if ex is not None:  # one example of the level's hint, for the record
                emit({"bench": "tooluse-hints", "example_hint": lv, "family": ex.family,
                      "seed": ex.seed, "hint": ex.hint})  # fmt: skip
            if dump is not None:
                with dump.open("a") as f:
                    for e in eps:
                        f.write(episode_json(e, lv, temp) + "\n")
    return out


def solution_logprob(learner: Any, tasks: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """Teacher-forced: the hint-free policy's mean per-token log-prob of the scripted
    solver's first call (the computation, the step every failed attempt got wrong) on
    held-out tasks, per family. A cheap, dense stand-in for greedy success where decoding
    a held-out set per arm does not fit the time (2 shared CPU cores)."""
    from agentrl.learners.tooluse import solved_episodes, solved_items
    from agentrl.learners.tooluse_hints import _logprobs

    items = [solved_items(learner.tokenizer, ep)[0] for ep in solved_episodes(4, tasks)]
    lps = _logprobs(learner.trainer, items, hinted=False, grad=False)
    out: dict[str, Any] = {}
    for fam in sorted({it.family for it in items}):
        mine = [lp for it, lp in zip(items, lps, strict=True) if it.family == fam]
        tokens = sum(len(lp) for lp in mine)
        out[fam] = {
            "tasks": len(mine),
            "logp_per_token": round(sum(float(lp.sum()) for lp in mine) / tokens, 4),
            "logp_per_call": round(sum(float(lp.sum()) for lp in mine) / len(mine), 2),
        }
    return out


def compare(
    start: str, families: Sequence[str], train_n: int, samples: int, level: str, n: int,
    batch_size: int, modes: Sequence[str], epochs: int, lr: float, emit: Any,
    group: int = 2, evaluate: str = "greedy",
) -> None:  # fmt: skip
    """The same failed attempts, each mode's items trained from the same start; greedy
    held-out success after (the start's own greedy figure is `measure`'s level none)."""
    import torch

    from agentrl.envs.tooluse.tasks import generate_task
    from agentrl.learners.tooluse import RL_SEED_BASE
    from agentrl.learners.tooluse_hints import (
        attempts_of,
        balance,
        distill_items,
        importance_items,
        train_items,
    )

    train = [(f, RL_SEED_BASE + 50_000 + j) for f in families for j in range(train_n)]
    held = heldout(families, n)
    first = _learner(start, batch_size, seed=1)
    t0 = time.perf_counter()
    if evaluate == "logprob":
        emit({"bench": "tooluse-hints", "part": "compare", "mode": "start",
              "solution_logprob": solution_logprob(first, held)})  # fmt: skip
    plain = first.play([k for k in train for _ in range(group)], 1.0)
    by_task: dict[tuple[str, int], list[Any]] = {}
    for ep in plain:
        by_task.setdefault((ep.family, ep.seed), []).append(ep)
    failed = {k: eps for k, eps in by_task.items() if not any(e.success for e in eps)}
    hints = {
        k: hint_of(level, generate_task(k[1], k[0]), attempts_of(eps)) or ""
        for k, eps in failed.items()
    }
    emit({"bench": "tooluse-hints", "part": "compare", "train_tasks": len(train),
          "failed_tasks": len(failed), "level": level,
          "wall_s": round(time.perf_counter() - t0, 1)})  # fmt: skip
    for mode in modes:
        learner = first if mode == modes[0] else _learner(start, batch_size, seed=1)
        learner.set_lr(lr)
        t1 = time.perf_counter()
        counts: dict[str, Any] = {}
        if mode == "importance":
            batch = [k for k in failed for _ in range(samples)]
            again = learner.play(batch, 1.0, hints=[hints[k] for k in batch])
            items = importance_items(again)
            counts = {"hinted_samples": len(again),
                      "hinted_successes": sum(e.success for e in again)}  # fmt: skip
        else:
            items = distill_items(
                learner.tokenizer, [e for eps in failed.values() for e in eps], hints
            )
        balance(items)
        gen = torch.Generator().manual_seed(0)
        stats: dict[str, Any] = {}
        for _ in range(epochs):
            stats = train_items(learner.trainer, items, 8, 1.0, gen)
        t2 = time.perf_counter()
        row: dict[str, Any] = {
            "bench": "tooluse-hints", "part": "compare", "mode": mode, "level": level,
            "items": len(items), **counts, "train": stats, "epochs": epochs, "lr": lr,
            "prepare_train_s": round(t2 - t1, 1),
        }  # fmt: skip
        if evaluate == "logprob":
            row["solution_logprob"] = solution_logprob(learner, held)
            row["eval_s"] = round(time.perf_counter() - t2, 1)
            emit(row)
            continue
        after = learner.play(held, 0.0)
        row["eval_s"] = round(time.perf_counter() - t2, 1)
        for fam in families:
            mine = [e for e in after if e.family == fam]
            row[fam] = rate(sum(e.success for e in mine), len(mine))
        row["all"] = rate(sum(e.success for e in after), len(after))
        emit(row)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agentrl.bench.tooluse_hints")
    p.add_argument("part", choices=["measure", "compare"])
    p.add_argument("--start", required=True, help="a tool-use checkpoint folder")
    p.add_argument("--families", nargs="+", default=["data", "numbers"])
    p.add_argument("--n", type=int, default=30, help="held-out tasks per family")
    p.add_argument("--skip", type=int, default=0, help="measure: after the first SKIP tasks")
    p.add_argument("--levels", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    p.add_argument("--temps", nargs="+", type=float, default=[0.0, 1.0])
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--train-n", type=int, default=8, help="compare: training tasks per family")
    p.add_argument("--samples", type=int, default=4, help="compare: hinted resamples per task")
    p.add_argument("--level", default="plan", choices=list(LEVELS)[1:])
    p.add_argument("--modes", nargs="+", default=["importance", "distill"])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--group", type=int, default=2, help="compare: hint-free attempts per task")
    p.add_argument("--evaluate", choices=["greedy", "logprob"], default="greedy")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 on a loaded host)")
    p.add_argument("--episodes", type=Path, default=None, help="measure: episodes as JSONL")
    p.add_argument("--out", type=Path, default=None, help="also append the JSON lines here")
    a = p.parse_args(argv)

    def emit(row: dict[str, Any]) -> None:
        line = json.dumps(row)
        print(line, flush=True)
        if a.out is not None:
            with a.out.open("a") as f:
                f.write(line + "\n")

    import torch

    torch.set_num_threads(a.threads)
    if a.part == "measure":
        measure(a.start, a.families, a.n, a.levels, a.temps, a.batch_size, emit, a.episodes, a.skip)
    else:
        compare(a.start, a.families, a.train_n, a.samples, a.level, a.n, a.batch_size,
                a.modes, a.epochs, a.lr, emit, a.group, a.evaluate)  # fmt: skip


if __name__ == "__main__":
    main()
