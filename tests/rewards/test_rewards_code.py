"""Code in trajectories: extraction, pytest summaries, real ruff + bandit in batches."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.rewards import RewardConfig, score_batch
from agentrl.rewards.code import (
    CodeChecker,
    SnippetReport,
    evidence_for,
    extract_code,
    lint_score,
    parse_pytest_summary,
)
from agentrl.rewards.components import code_quality
from agentrl.rewards.pipeline import Failure, Preparer, score_payloads
from agentrl.rewards.window import WindowState

CLEAN = "def add(a, b):\n    return a + b\n"
SYNTAX_ERROR = "def broken(:\n    pass\n"
UNUSED_IMPORT = "import os\n\n\nx = 1\ny = 2\nz = x + y\n"
SHELL_INJECTION = (
    "import subprocess\n\n\ndef run(cmd):\n    return subprocess.call('ls ' + cmd, shell=True)\n"
)


def with_turns(actions: list[dict], outputs: list[str | None] | None = None) -> TrajectoryEvent:
    doc = sample_trajectory(11, turns=len(actions))
    for i, action in enumerate(actions):
        doc["turns"][i]["action"] = action
        doc["turns"][i]["result"] = {
            "success": True,
            "output": (outputs or [None] * len(actions))[i],
        }
    return TrajectoryEvent.model_validate(doc)


def test_extracts_code_tool_calls_and_fenced_python() -> None:
    t = with_turns(
        [
            {
                "type": "tool_call",
                "tool_name": "code_execution_tool",
                "tool_args": {"runtime": "python", "code": CLEAN},
            },
            {
                "type": "tool_call",
                "tool_name": "code_execution_tool",
                "tool_args": {"runtime": "terminal", "code": "ls -la"},
            },
            {
                "type": "response",
                "raw_response": f"Here:\n```python\n{UNUSED_IMPORT}```\nand\n```\n{CLEAN}```\n```json\n{{}}\n```",
            },
            {
                "type": "tool_call",
                "tool_name": "search",
                "tool_args": {"code": "not code, a search tool"},
            },
        ]
    )
    code = extract_code(t)
    assert code.python == [CLEAN, UNUSED_IMPORT, CLEAN]
    assert code.other == ["ls -la"]
    assert code.contains_code


def test_no_code_means_not_applicable() -> None:
    t = TrajectoryEvent.model_validate(sample_trajectory(4))
    code = extract_code(t)
    assert not code.contains_code
    assert code_quality(evidence_for(code, [])) is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("=========== 3 passed in 0.12s ===========", (3, 3)),
        ("== 2 failed, 5 passed, 1 error in 1.0s ==", (5, 8)),
        ("first\n== 1 failed in 0.1s ==\nrerun\n== 4 passed in 0.2s ==", (4, 4)),
        ("no tests ran", None),
    ],
)
def test_pytest_summary(text: str, want: tuple[int, int] | None) -> None:
    assert parse_pytest_summary(text) == want


def test_outcome_test_results_win_over_parsed_output() -> None:
    doc = sample_trajectory(12, code=True)
    doc["metadata"]["outcome"]["test_results"] = {"passed": 2, "total": 5}
    code = extract_code(TrajectoryEvent.model_validate(doc))
    assert (code.tests_passed, code.tests_total) == (2, 5)
    doc["metadata"]["outcome"].pop("test_results")
    code = extract_code(TrajectoryEvent.model_validate(doc))
    assert (code.tests_passed, code.tests_total) == (1, 1)  # from the pytest output


def test_lint_score_formula() -> None:
    assert lint_score(
        [SnippetReport(lines=20, syntax_errors=0, findings=3, high=0, medium=0, low=0)]
    ) == pytest.approx(8.5)
    assert lint_score(
        [SnippetReport(lines=10, syntax_errors=1, findings=0, high=0, medium=0, low=0)]
    ) == pytest.approx(5.0)
    assert (
        lint_score([SnippetReport(lines=2, syntax_errors=2, findings=0, high=0, medium=0, low=0)])
        == 0.0
    )
    two = [SnippetReport(10, 0, 1, 0, 0, 0), SnippetReport(30, 0, 1, 0, 0, 0)]
    assert lint_score(two) == pytest.approx(10 - 10 * 2 / 40)


def test_real_ruff_and_bandit_in_one_batch() -> None:
    checker = CodeChecker()
    reports = checker.check_sync([CLEAN, SYNTAX_ERROR, UNUSED_IMPORT, SHELL_INJECTION, CLEAN])
    clean, syntax, unused, shell, clean2 = reports
    assert (
        clean
        == clean2
        == SnippetReport(lines=2, syntax_errors=0, findings=0, high=0, medium=0, low=0)
    )
    assert syntax.syntax_errors >= 1 and lint_score([syntax]) == 0.0
    assert unused.findings == 1 and unused.syntax_errors == 0  # F401 os imported but unused
    assert shell.high == 1  # B602 subprocess with shell=True and a non-literal command
    assert checker.stats["ruff_runs"] == 1 and checker.stats["bandit_runs"] == 1  # batched
    # cached by content: no new tool runs
    again = checker.check_sync([UNUSED_IMPORT, SHELL_INJECTION])
    assert again == [unused, shell]
    assert checker.stats["ruff_runs"] == 1 and checker.stats["cache_hits"] == 2


def test_code_quality_from_real_tools_through_the_pipeline() -> None:
    doc = sample_trajectory(10, code=True)  # i % 5 == 0: shell=True with a variable command
    (scored,), _ = asyncio.run(score_payloads([doc]))
    assert not isinstance(scored, Failure)
    cq = scored.event.reward_components["code_quality"]
    metrics = (cq.model_extra or {})["metrics"]
    assert metrics["critical_issues"] == 1 and metrics["tests_passed"] == 1
    assert cq.score == pytest.approx((metrics["lint_score"] / 10 + 1.0 + 0.5) / 3)
    assert cq.reasoning is not None and "1 critical security issue" in cq.reasoning


# ---- one bad snippet must not poison its batch (issue 11, defect 2) ------------------------
def _traj_with_code(i: int, code: str) -> TrajectoryEvent:
    doc = sample_trajectory(i, code=True, trajectory_id=str(uuid.uuid4()))
    doc["turns"][1]["action"] = {
        "type": "tool_call",
        "tool_name": "code_execution_tool",
        "tool_args": {"runtime": "python", "code": code},
    }
    return TrajectoryEvent.model_validate(doc)


STACK_BUSTER = "x = " + "+".join(["1"] * 20_000) + "\n"  # overflows ruff's stack (exit 134)


def test_a_snippet_that_crashes_ruff_is_isolated_and_the_rest_is_scored() -> None:
    events = [
        _traj_with_code(1, "import os\nprint(os.getcwd())\n"),
        _traj_with_code(2, STACK_BUSTER),
        _traj_with_code(3, "def f(x):\n    return x +\n"),  # a syntax error is a finding
    ]
    preparer = Preparer(RewardConfig())
    batch = asyncio.run(preparer.prepare(events))
    assert batch.failures == {}  # nobody is retried or dead-lettered
    good, bad, broken = (batch.inputs[i].code for i in range(3))
    assert good.lint_score is not None and good.unavailable is None
    assert broken.lint_score is not None and broken.lint_findings >= 1
    assert bad.lint_score is None and bad.unavailable is not None
    assert "ruff failed" in bad.unavailable
    rewards, _ = score_batch([batch.inputs[i] for i in range(3)], WindowState(), RewardConfig())
    cq = rewards[1].payload["reward_components"]["code_quality"]
    assert "unavailable" in cq["metrics"]  # scored from what could be measured (tests)
    assert preparer.checker.stats["unanalysable"] == 1
    preparer.checker.close()


def test_the_tools_are_bounded_by_a_timeout() -> None:
    checker = CodeChecker(timeout_s=0.001)  # nothing can finish in a millisecond
    t0 = time.perf_counter()
    reports = checker.check_sync(["print(1)\n", "print(2)\n"])
    assert time.perf_counter() - t0 < 20
    assert all(r.error is not None for r in reports)
    assert any("past 0.001s" in (r.error or "") for r in reports)
    checker.close()
