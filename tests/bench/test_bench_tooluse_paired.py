"""Paired comparison of two held-out runs (`bench.tooluse_paired`): gained and lost tasks per
family, the exact sign test, the command line on files the harness saved, and a clear error
(no figure) when the two files do not hold the same tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.bench.tooluse_job import save_episodes
from agentrl.bench.tooluse_paired import main
from agentrl.evaluation.tooluse_paired import paired, sign_test_p
from agentrl.learners.tooluse_episodes import EpisodeRecord


def runs(wins: dict[tuple[str, int], bool]) -> list[EpisodeRecord]:
    return [EpisodeRecord(f, s, "q", [], success=ok) for (f, s), ok in wins.items()]


BEFORE = {("arithmetic", 1): True, ("arithmetic", 2): False, ("data", 1): False,
          ("numbers", 1): False, ("numbers", 2): True}  # fmt: skip
AFTER = {("arithmetic", 1): False, ("arithmetic", 2): True, ("data", 1): False,
         ("numbers", 1): True, ("numbers", 2): True}  # fmt: skip


def test_paired_counts_gained_and_lost_tasks_per_family() -> None:
    out = paired(runs(BEFORE), list(reversed(runs(AFTER))))  # order does not matter
    assert out == {
        "tasks": 5,
        "reference_ok": 2,
        "other_ok": 3,
        "gained": 2,
        "lost": 1,
        "gained_by_family": {"arithmetic": 1, "data": 0, "numbers": 1},
        "lost_by_family": {"arithmetic": 1, "data": 0, "numbers": 0},
        "sign_test_p": 1.0,
    }


def test_the_sign_test_is_exact_and_two_sided() -> None:
    # s28's replay-importance against the start: 10 gained, 3 lost -> p = 0.0923
    assert sign_test_p(10, 3) == pytest.approx(2 * sum([1, 13, 78, 286]) / 2**13)
    assert round(sign_test_p(10, 3), 4) == 0.0923 and sign_test_p(3, 10) == sign_test_p(10, 3)
    assert sign_test_p(0, 0) == 1.0 and sign_test_p(5, 5) == 1.0
    assert sign_test_p(6, 0) == pytest.approx(2 / 64)


def test_different_tasks_are_not_compared() -> None:
    other = dict(AFTER)
    del other[("data", 1)]
    other[("data", 9)] = True
    with pytest.raises(ValueError, match="not the same tasks"):
        paired(runs(BEFORE), runs(other))
    with pytest.raises(ValueError, match="once each"):  # a task twice
        paired(runs(BEFORE), runs(AFTER) + runs({("data", 1): True}))


def test_the_command_line_compares_two_saved_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, c = tmp_path / "before.jsonl", tmp_path / "after.jsonl", tmp_path / "short.jsonl"
    save_episodes(a, runs(BEFORE))
    save_episodes(b, runs(AFTER))
    save_episodes(c, runs(AFTER)[:3])
    main([str(a), str(b)])
    line = json.loads(capsys.readouterr().out)
    assert line["reference"] == str(a) and line["gained"] == 2 and line["lost"] == 1
    with pytest.raises(SystemExit):
        main([str(a), str(c)])
    assert "not the same tasks" in capsys.readouterr().err
