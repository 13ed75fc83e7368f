"""Why held-out tool-use episodes failed (`evaluation.tooluse_failures`): every class on an
episode shaped as the learner records it, the family's tool taken from the scripted solver,
and the per-family table the job harness puts in its record."""

from __future__ import annotations

from agentrl.envs.tooluse.tasks import generate_task
from agentrl.evaluation.tooluse_failures import (
    CLASSES,
    failure_class,
    failure_table,
    family_tool,
    first_tool_table,
)
from agentrl.learners.tooluse_episodes import EpisodeRecord, TurnRecord

SEED = 100_000


def call(tool: str | None, finish: str = "stop", error: bool = False) -> TurnRecord:
    return TurnRecord([1], [2], [-0.1], "{}", finish, tool, "out", tool_error=error)


def answer(text: str) -> TurnRecord:
    return TurnRecord([1], [2], [-0.1], "{}", "stop", "response", None, answer=text)


def episode(family: str, *turns: TurnRecord, **flags: bool) -> EpisodeRecord:
    task = generate_task(SEED, family)
    ep = EpisodeRecord(family, SEED, task.question, list(turns))
    ep.answered = any(t.tool_name == "response" for t in turns)
    for k, v in flags.items():
        setattr(ep, k, v)
    return ep


def test_each_failure_has_one_class_the_first_that_applies() -> None:
    assert [family_tool(episode(f)) for f in ("arithmetic", "data", "numbers")] == [
        "calculator",
        "code_exe",
        "code_exe",
    ]
    cases = {
        # a cut reply wins over everything after it (the episode still answered)
        "cut": episode("data", call(None, finish="length"), call("code_exe"), answer("3")),
        "no_answer": episode("numbers", call("code_exe"), call("code_exe")),
        # the tool showed the right value, the answer dropped its sign
        "wrong_final": episode(
            "arithmetic", call("calculator"), answer("5"), answer_in_result=True
        ),
        "no_tool": episode("arithmetic", answer("5")),
        # data in the calculator: ran, but not the family's tool
        "wrong_tool": episode("data", call("calculator"), answer("5")),
        "tool_error": episode("numbers", call("code_exe", error=True), answer("5")),
        # the calculator ran the wrong expression and the answer copied it
        "wrong_args": episode("arithmetic", call("calculator"), answer("5")),
    }
    assert set(cases) == set(CLASSES)
    for want, ep in cases.items():
        assert failure_class(ep) == want, want
    # the last call decides: an errored calculator then the family's program that ran
    retried = episode("data", call("calculator", error=True), call("code_exe"), answer("5"))
    assert failure_class(retried) == "wrong_args"
    won = episode("arithmetic", call("calculator"), answer("5"), success=True)
    assert failure_class(won) is None

    table = failure_table([*cases.values(), won, won])
    assert table == {
        "arithmetic": {"wrong_final": 1, "no_tool": 1, "wrong_args": 1},
        "data": {"cut": 1, "wrong_tool": 1},
        "numbers": {"no_answer": 1, "tool_error": 1},
    }
    assert list(table["arithmetic"]) == ["wrong_final", "no_tool", "wrong_args"]  # CLASSES order


def test_the_first_tool_table_counts_each_episode_by_its_first_call() -> None:
    """Per family, each episode once, by the first tool it called (not its last, and not
    `response`); an episode that called none is `none`."""
    eps = [
        episode("arithmetic", call("calculator"), answer("5"), success=True),
        episode("arithmetic", call("code_exe"), call("calculator"), answer("5")),  # drifted
        episode("arithmetic", answer("5")),
        episode("data", call(None, finish="length")),
        episode("data", call("code_exe", error=True), call("code_exe"), answer("5")),
    ]
    assert first_tool_table(eps) == {
        "arithmetic": {"calculator": 1, "code_exe": 1, "none": 1},
        "data": {"code_exe": 1, "none": 1},
    }
    assert first_tool_table([]) == {}
