"""The tool-use loop's held-out outcome per task (issue 52): one row per held-out episode,
kept per version in `<data-dir>/heldout/<version>.jsonl`, so the run's versions compare
task by task (gained and lost per family with the sign test, `evaluation.tooluse_paired`)
and each version's first tool per family is known (`evaluation.tooluse_failures`). The
totals alone could say neither: a separate probe had to find that v2 opened 19 of 20
numbers tasks with the calculator.

The loop plays held-out through the gateway (`RLRolloutWorker` episodes); each is read with
the fields of the job harness's `EpisodeRecord`, so the harness's classification applies
unchanged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PAIRED_KEYS = ("paired_candidate_vs_start", "paired_live_vs_start")


def _tool_result(step: Any) -> str | None:
    """The tool's output as the agent saw it, unwrapped from Agent Zero's JSON message."""
    history = step.resulting_messages_history
    if not history or history[-1].role not in ("user", "tool"):
        return None
    text = str(history[-1].content or "")
    try:
        body = json.loads(text)
    except ValueError:
        return text
    return str(body.get("tool_result", text)) if isinstance(body, dict) else text


def record_of(episode: Any, task: Any, seed: int, pool: str) -> SimpleNamespace:
    """A rollout episode of the loop with the fields of the harness's `EpisodeRecord` that
    its classification reads (a namespace: the record's module imports torch): per turn the
    tool, its error, the reply's finish reason; whether a tool showed the answer and whether
    the agent answered."""
    from agentrl.envs.tooluse.solver import answer_from
    from agentrl.envs.tooluse.tasks import check_answer
    from agentrl.evaluation.tooluse_failures import TOOLS

    rec = SimpleNamespace(family=task.family, seed=seed, pool=pool, success=episode.success,
                          turns=[], answered=False, answer_in_result=False)  # fmt: skip
    for step in episode.steps:
        info = step.step_info
        tool = info.get("tool_name")
        result = _tool_result(step) if tool in TOOLS else None
        finish = (step.policy_logprobs or {}).get("finish_reason")
        rec.turns.append(
            SimpleNamespace(tool_name=tool, finish=finish, tool_error=bool(info.get("tool_error")))
        )
        if result is not None and check_answer(answer_from(result), task):
            rec.answer_in_result = True
        rec.answered = rec.answered or tool == "response"
    return rec


def task_row(episode: Any, family: str, seed: int, pool: str) -> dict[str, Any]:
    """One held-out episode's line: the task, its outcome, the environment's reward, the
    first tool, the failure class, whether a reply hit the token cap; `error`: the episode
    ended on an error and measured nothing (left out of every figure)."""
    from agentrl.app.loop_tooluse import cut_by_token_cap
    from agentrl.envs.tooluse.tasks import generate_task
    from agentrl.evaluation.tooluse_failures import failure_class, first_tool

    error = episode.critical_error
    cut, replies = cut_by_token_cap(episode)
    row: dict[str, Any] = {"task_id": None, "family": family, "seed": seed, "pool": pool,
                           "success": False, "reward": round(float(episode.total_reward), 4),
                           "first_tool": "none", "failure": None, "cut": cut > 0,
                           "replies": replies, "error": error}  # fmt: skip
    try:
        task = generate_task(seed, family, pool)
        rec = record_of(episode, task, seed, pool)
        row.update(task_id=task.task_id, first_tool=first_tool(rec))
        if not error:
            row.update(success=bool(rec.success), failure=failure_class(rec))
    except Exception as exc:  # one unreadable episode costs its row, not the evaluation
        row["error"] = f"not classified: {type(exc).__name__}: {exc}"
    return row


def write_rows(folder: Path, rows: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """One JSONL file per version (`<version>.jsonl`, both pools), whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for model, lines in rows.items():
        path = folder / f"{re.sub(r'[^A-Za-z0-9._-]', '_', model)}.jsonl"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in lines))
        tmp.replace(path)
        paths.append(path)
    return paths


def _measured(rows: list[dict[str, Any]], pool: str) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["family"], r["seed"]): r for r in rows if r["pool"] == pool and not r["error"]}


def paired_rows(
    reference: list[dict[str, Any]], other: list[dict[str, Any]], pool: str = "train"
) -> dict[str, Any] | None:
    """`evaluation.tooluse_paired.paired` on one pool's tasks both versions measured (an
    episode that ended on an error pairs with nothing); None when they share none."""
    from agentrl.evaluation.tooluse_paired import paired

    ref, new = _measured(reference, pool), _measured(other, pool)
    common = sorted(ref.keys() & new.keys())
    if not common:
        return None
    return paired(
        [SimpleNamespace(**ref[k]) for k in common], [SimpleNamespace(**new[k]) for k in common]
    )


def figures(
    rows: dict[str, list[dict[str, Any]]],
    start: str | None,
    candidate: str | None,
    live: str | None,
) -> dict[str, Any]:
    """The loop's JSON keys from the rows: the candidate (and the live version, when it is
    not the start) paired against the start on the generator's held-out tasks (`unseen_`:
    the unseen pool's, when it was played), None where a side was not measured or is the
    start itself; `first_tool_by_family` of start, candidate and live (generator pool)."""
    from agentrl.evaluation.tooluse_failures import tool_counts

    def pair(other: str | None, pool: str) -> dict[str, Any] | None:
        if start is None or other is None or other == start:
            return None
        if start not in rows or other not in rows:
            return None
        return paired_rows(rows[start], rows[other], pool)

    pools = ["train"] + (
        ["unseen"] if any(r["pool"] == "unseen" for v in rows.values() for r in v) else []
    )
    out: dict[str, Any] = {}
    for pool in pools:
        prefix = "unseen_" if pool == "unseen" else ""
        out[f"{prefix}paired_candidate_vs_start"] = pair(candidate, pool)
        if live != start:
            out[f"{prefix}paired_live_vs_start"] = pair(live, pool)
    out["first_tool_by_family"] = {
        name: tool_counts(
            (r["family"], r["first_tool"]) for r in _measured(rows[m], "train").values()
        )
        for name, m in (("start", start), ("candidate", candidate), ("live", live))
        if m is not None and m in rows
    }
    return out


def describe(figs: dict[str, Any]) -> list[str]:
    """The console's lines for the paired figures (the table's end)."""
    lines = []
    for key in (*PAIRED_KEYS, *(f"unseen_{k}" for k in PAIRED_KEYS)):
        p = figs.get(key)
        if p is None:
            continue
        fams = ", ".join(
            f"{f} +{p['gained_by_family'][f]} -{p['lost_by_family'][f]}"
            for f in p["gained_by_family"]
        )
        who = key.removeprefix("unseen_").removeprefix("paired_").replace("_vs_", " vs ")
        pool = "unseen pool" if key.startswith("unseen_") else "held-out"
        lines.append(
            f"paired, {who} ({pool}): {p['gained']} gained, {p['lost']} lost of {p['tasks']} "
            f"tasks (sign test p = {p['sign_test_p']}; {fams})"
        )
    return lines


def first_tool_line(rows: list[dict[str, Any]]) -> str:
    """A version's first tool per family, as the table's line under its per-family line."""
    from agentrl.evaluation.tooluse_failures import tool_counts

    table = tool_counts((r["family"], r["first_tool"]) for r in _measured(rows, "train").values())
    return "; ".join(
        f"{f} " + ", ".join(f"{t} {n}" for t, n in tools.items()) for f, tools in table.items()
    )
