"""Why tool-use episodes fail, one class per failed episode, so a harness run says which
step an intervention must fix (issue 52: the start's arithmetic failures were wrong
expressions, not tool choice nor the answer step; data's and numbers' the wrong tool, cut
or broken programs). The family's tool is the scripted solver's (`solver.first_action`).

Classes, the first that applies:
  cut          a reply ran into the token cap
  no_answer    the episode ended without a `response`
  wrong_final  a tool result showed the right answer, the final answer was wrong
  no_tool      answered without a tool call
  wrong_tool   the last tool call was not the family's tool
  tool_error   the family's tool, and it failed (a calculator error, a traceback)
  wrong_args   the family's tool ran and showed a wrong value (the argument was wrong)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

CLASSES = (
    "cut",
    "no_answer",
    "wrong_final",
    "no_tool",
    "wrong_tool",
    "tool_error",
    "wrong_args",
)
TOOLS = ("calculator", "code_exe")


def family_tool(episode: Any) -> str | None:
    """The tool the scripted solver calls first for the episode's task (None: no spec)."""
    from agentrl.envs.tooluse.solver import first_action
    from agentrl.envs.tooluse.tasks import generate_task

    try:
        return first_action(generate_task(episode.seed, episode.family, episode.pool))[1]
    except (ValueError, KeyError):
        return None


def failure_class(episode: Any) -> str | None:
    """The episode's failure class (`CLASSES`), None for a success."""
    if episode.success:
        return None
    turns = episode.turns
    calls = [t for t in turns if t.tool_name in TOOLS]
    if any(t.finish == "length" for t in turns):
        return "cut"
    if not episode.answered:
        return "no_answer"
    if episode.answer_in_result:
        return "wrong_final"
    if not calls:
        return "no_tool"
    if calls[-1].tool_name != family_tool(episode):
        return "wrong_tool"
    return "tool_error" if calls[-1].tool_error else "wrong_args"


def failure_table(episodes: Sequence[Any]) -> dict[str, dict[str, int]]:
    """Per family, the failed episodes per class (classes with none left out)."""
    out: dict[str, dict[str, int]] = {}
    for ep in episodes:
        c = failure_class(ep)
        if c is not None:
            row = out.setdefault(ep.family, {})
            row[c] = row.get(c, 0) + 1
    return {f: {c: row[c] for c in CLASSES if c in row} for f, row in sorted(out.items())}


def first_tool(episode: Any) -> str:
    """The first tool the episode called (`none`: answered, cut or stopped before any call)."""
    return next((t.tool_name for t in episode.turns if t.tool_name in TOOLS), None) or "none"


def first_tool_table(episodes: Sequence[Any]) -> dict[str, dict[str, int]]:
    """Per family, the episodes by the first tool they called (`first_tool`): a family
    drifting to another family's tool shows here before it shows in the failures
    (arithmetic to code_exe after training on data's programs)."""
    return tool_counts((ep.family, first_tool(ep)) for ep in episodes)


def tool_counts(pairs: Iterable[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """(family, first tool) pairs counted per family, families and tools sorted: the table
    of `first_tool_table`, also from saved rows that keep the first tool, not the turns."""
    out: dict[str, dict[str, int]] = {}
    for family, tool in pairs:
        row = out.setdefault(family, {})
        row[tool] = row.get(tool, 0) + 1
    return {f: dict(sorted(row.items())) for f, row in sorted(out.items())}
