"""Finding the code in a trajectory, and checking it with ruff and bandit in batches.

Code comes from code-execution tool calls (Agent Zero's `code_execution_tool` passes
`{"runtime": "python", "code": ...}`) and from fenced blocks in the agent's responses. Test
results come from the outcome block (`test_results: {passed, total}`) or, failing that, from
the last pytest summary line in a code tool's output.

Checking is batched: a whole batch of snippets is written to one temporary directory, ruff
runs once over it as a subprocess (JSON output) while bandit runs in a forked worker process
on the same files, and results are cached by content hash. Both tools are bounded by a
timeout. When a batch run fails (a snippet that crashes ruff, e.g. a 20,000-term expression
that overflows its stack, or a timeout), the batch is bisected until the culprit is alone:
that snippet gets a report marked unanalysable (the code-quality component says so and the
trajectory is still scored), and every other snippet its real report.

Lint score (documented formula, in the spirit of pylint's 10-point score):
    score = max(0, 10 - 10 x (5 x syntax_errors + other_findings) / lines)
with `lines` the non-blank, non-comment lines of the snippet(s). Critical security issues are
bandit findings of HIGH severity (any confidence).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.contracts.trajectory import TrajectoryEvent
from agentrl.core import pyparse
from agentrl.rewards.components import CodeEvidence
from agentrl.rewards.isolation import ForkedWorker, WorkerCrashed, WorkerTimeout

log = logging.getLogger(__name__)

DEFAULT_CODE_TOOLS = (
    "code_exe",
    "code_execution",
    "code_execution_tool",
    "execute_code",
    "run_code",
    "python",
    "python_repl",
)
PYTHON_RUNTIMES = {"python", "python3", "py", "ipython"}
CODE_ARG_KEYS = ("code", "source", "script", "program")
DEFAULT_LINT_RULES = ("E", "F", "W", "B")
DEFAULT_LINT_IGNORE = ("E501", "W291", "W292", "W293", "W391")  # line length and whitespace nits

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTEST_SUMMARY = re.compile(r"=+ (.*?\b(?:passed|failed|error|errors)\b.*?) in [\d.]+s.* =+")
_COUNT = re.compile(r"(\d+) (passed|failed|errors?)")


@dataclass
class ExtractedCode:
    python: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    tests_passed: int | None = None
    tests_total: int | None = None

    @property
    def contains_code(self) -> bool:
        return bool(self.python or self.other)


def extract_code(
    trajectory: TrajectoryEvent, code_tools: Iterable[str] = DEFAULT_CODE_TOOLS
) -> ExtractedCode:
    """The Python snippets, other code, and test results of one trajectory."""
    tools = set(code_tools)
    out = ExtractedCode()
    pytest_counts: tuple[int, int] | None = None
    for turn in trajectory.turns:
        action = turn.action
        if action.type == "tool_call" and action.tool_name in tools:
            code = next(
                (
                    action.tool_args[k]
                    for k in CODE_ARG_KEYS
                    if isinstance(action.tool_args.get(k), str)
                ),
                None,
            )
            if code and code.strip():
                runtime = str(
                    action.tool_args.get("runtime", action.tool_args.get("language", "python"))
                ).lower()
                (out.python if runtime in PYTHON_RUNTIMES else out.other).append(code)
            if turn.result is not None and isinstance(turn.result.output, str):
                counts = parse_pytest_summary(turn.result.output)
                if counts is not None:
                    pytest_counts = counts
        if action.raw_response and "```" in action.raw_response:
            for lang, body in _FENCE.findall(action.raw_response):
                if not body.strip():
                    continue
                lang = lang.lower()
                if lang in PYTHON_RUNTIMES or (lang == "" and _parses(body)):
                    out.python.append(body)
                elif lang not in ("", "text", "txt", "output", "console", "json", "log"):
                    out.other.append(body)
    outcome = trajectory.outcome
    tr = outcome.test_results if outcome is not None else None
    if tr and tr.get("total"):
        out.tests_passed, out.tests_total = int(tr.get("passed", 0)), int(tr["total"])
    elif pytest_counts is not None:
        out.tests_passed, out.tests_total = pytest_counts
    return out


def parse_pytest_summary(text: str) -> tuple[int, int] | None:
    """(passed, total) from the last pytest summary line, e.g. '=== 3 passed, 1 failed in 0.1s ==='."""
    found = _PYTEST_SUMMARY.findall(text)
    if not found:
        return None
    counts = {"passed": 0, "failed": 0, "error": 0}
    for n, kind in _COUNT.findall(found[-1]):
        counts["error" if kind.startswith("error") else kind] += int(n)
    total = sum(counts.values())
    return (counts["passed"], total) if total else None


def _parses(code: str) -> bool:
    try:
        pyparse.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class SnippetReport:
    """Checker findings for one snippet (`error` set: the tools could not analyse it)."""

    lines: int
    syntax_errors: int
    findings: int  # other ruff findings
    high: int  # bandit HIGH severity
    medium: int
    low: int
    error: str | None = None


class CheckerFailure(RuntimeError):
    """ruff or bandit failed (crashed, timed out) on a batch of snippets."""


def lint_score(reports: Sequence[SnippetReport]) -> float:
    """The documented 10-point score over all snippets of a trajectory."""
    lines = sum(r.lines for r in reports)
    weighted = sum(5 * r.syntax_errors + r.findings for r in reports)
    if lines == 0:
        return 10.0 if weighted == 0 else 0.0
    return max(0.0, 10.0 - 10.0 * weighted / lines)


def evidence_for(code: ExtractedCode, reports: Sequence[SnippetReport]) -> CodeEvidence:
    """Fold one trajectory's extracted code and checker reports into component evidence;
    snippets the tools could not analyse are left out and named in `unavailable`."""
    ev = CodeEvidence(
        contains_code=code.contains_code,
        tests_passed=code.tests_passed,
        tests_total=code.tests_total,
    )
    failed = [r.error for r in reports if r.error]
    if failed:
        ev.unavailable = (
            f"{len(failed)} of {len(reports)} snippet(s) could not be analysed: {failed[0]}"
        )
        reports = [r for r in reports if not r.error]
    if reports:
        ev.lint_score = lint_score(reports)
        ev.lint_findings = sum(r.syntax_errors + r.findings for r in reports)
        ev.lint_lines = sum(r.lines for r in reports)
        ev.critical_issues = sum(r.high for r in reports)
        ev.other_security_issues = sum(r.medium + r.low for r in reports)
    return ev


def _code_lines(code: str) -> int:
    return sum(
        1 for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")
    )


class CodeChecker:
    """Runs ruff (one subprocess per batch) and bandit (in-process) over many snippets."""

    def __init__(
        self,
        rules: Sequence[str] = DEFAULT_LINT_RULES,
        ignore: Sequence[str] = DEFAULT_LINT_IGNORE,
        cache_size: int = 4096,
        ruff: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.rules = tuple(rules)
        self.ignore = tuple(ignore)
        self.ruff = ruff or _find_ruff()
        self.cache_size = cache_size
        self.timeout_s = timeout_s
        self._cache: OrderedDict[str, SnippetReport] = OrderedDict()
        self._bandit_worker = ForkedWorker(_bandit_counts, "bandit")
        self.stats = {
            "snippets": 0,
            "cache_hits": 0,
            "ruff_runs": 0,
            "bandit_runs": 0,
            "batch_failures": 0,
            "unanalysable": 0,
        }

    def _key(self, code: str) -> str:
        return hashlib.blake2b(code.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()

    async def check(self, snippets: Sequence[str]) -> list[SnippetReport]:
        """Reports for `snippets` (same order); ruff and bandit run concurrently."""
        return await asyncio.to_thread(self.check_sync, snippets)

    def check_sync(self, snippets: Sequence[str]) -> list[SnippetReport]:
        self.stats["snippets"] += len(snippets)
        keys = [self._key(s) for s in snippets]
        todo: dict[str, str] = {}
        for key, code in zip(keys, snippets, strict=True):
            if key in self._cache:
                self._cache.move_to_end(key)
                self.stats["cache_hits"] += 1
            else:
                todo.setdefault(key, code)
        if todo:
            for key, report in self._run_isolated(todo).items():
                self._cache[key] = report
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        # A snippet evicted during this very call (huge batches) is recomputed alone.
        return [
            self._cache.get(k) or self._run_isolated({k: s})[k]
            for k, s in zip(keys, snippets, strict=True)
        ]

    def _run_isolated(self, todo: dict[str, str]) -> dict[str, SnippetReport]:
        """`_run`, bisecting a failing batch down to the snippets that make it fail."""
        try:
            return self._run(todo)
        except CheckerFailure as exc:
            self.stats["batch_failures"] += 1
            if len(todo) == 1:
                ((key, code),) = todo.items()
                self.stats["unanalysable"] += 1
                log.warning("code could not be analysed (%s); scoring without it", exc)
                return {key: SnippetReport(_code_lines(code), 0, 0, 0, 0, 0, error=str(exc))}
            items = list(todo.items())
            half = len(items) // 2
            return {
                **self._run_isolated(dict(items[:half])),
                **self._run_isolated(dict(items[half:])),
            }

    def close(self) -> None:
        self._bandit_worker.kill()

    def _run(self, todo: dict[str, str]) -> dict[str, SnippetReport]:
        with tempfile.TemporaryDirectory(prefix="agentrl-code-") as tmp:
            paths: dict[str, str] = {}
            for i, (key, code) in enumerate(todo.items()):
                path = os.path.join(tmp, f"s{i}.py")
                with open(path, "w", encoding="utf-8", errors="surrogatepass") as fh:
                    fh.write(code if code.endswith("\n") else code + "\n")
                paths[key] = path
            proc = subprocess.Popen(
                [
                    self.ruff,
                    "check",
                    "--isolated",
                    "--no-cache",
                    "--output-format",
                    "json",
                    "--exit-zero",
                    "--select",
                    ",".join(self.rules),
                    "--ignore",
                    ",".join(self.ignore),
                    "--target-version",
                    "py311",
                    tmp,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # runs while bandit works in its worker process
            try:
                bandit = self._bandit(list(paths.values()))
                out, err = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise CheckerFailure(f"ruff ran past {self.timeout_s}s") from exc
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            self.stats["ruff_runs"] += 1
            if proc.returncode != 0:
                raise CheckerFailure(
                    f"ruff failed (exit {proc.returncode}): "
                    f"{err.decode(errors='replace').strip()[-300:]}"
                )
            ruff: dict[str, list[dict[str, Any]]] = {}
            for item in json.loads(out or b"[]"):
                ruff.setdefault(os.path.realpath(item["filename"]), []).append(item)
            reports: dict[str, SnippetReport] = {}
            for key, path in paths.items():
                items = ruff.get(os.path.realpath(path), [])
                syntax = sum(
                    1 for it in items if it.get("code") in (None, "E999", "invalid-syntax")
                )
                sev = bandit.get(path, (0, 0, 0))
                reports[key] = SnippetReport(
                    lines=_code_lines(todo[key]),
                    syntax_errors=syntax,
                    findings=len(items) - syntax,
                    high=sev[0],
                    medium=sev[1],
                    low=sev[2],
                )
            return reports

    def _bandit(self, paths: list[str]) -> dict[str, tuple[int, int, int]]:
        """(HIGH, MEDIUM, LOW) severity counts per file, from the bandit worker process."""
        try:
            counts: dict[str, tuple[int, int, int]] = self._bandit_worker.call(
                (paths,), {}, self.timeout_s
            )
        except (WorkerTimeout, WorkerCrashed) as exc:
            raise CheckerFailure(f"bandit: {exc}") from exc
        self.stats["bandit_runs"] += 1
        return counts


_BANDIT_CONF: Any = None


def _bandit_counts(paths: list[str]) -> dict[str, tuple[int, int, int]]:
    """Runs in the bandit worker: bandit's own manager over `paths`."""
    global _BANDIT_CONF
    logging.getLogger("bandit").setLevel(logging.ERROR)
    logging.getLogger("stevedore.extension").setLevel(logging.CRITICAL)  # optional formatters
    from bandit.core import config as b_config
    from bandit.core import manager as b_manager

    if _BANDIT_CONF is None:
        _BANDIT_CONF = b_config.BanditConfig()
    mgr = b_manager.BanditManager(_BANDIT_CONF, "file", quiet=True)
    mgr.discover_files(paths)
    mgr.run_tests()
    counts: dict[str, list[int]] = {p: [0, 0, 0] for p in paths}
    for issue in mgr.get_issue_list():
        row = counts.setdefault(issue.fname, [0, 0, 0])
        sev = str(issue.severity).upper()
        row[0 if sev == "HIGH" else 1 if sev == "MEDIUM" else 2] += 1
    return {p: (c[0], c[1], c[2]) for p, c in counts.items()}


def _find_ruff() -> str:
    beside = Path(sys.executable).parent / "ruff"
    if beside.exists():
        return str(beside)
    try:
        from ruff.__main__ import find_ruff_bin

        return str(find_ruff_bin())
    except Exception:
        pass
    found = shutil.which("ruff")
    if found:
        return found
    raise RuntimeError("ruff not found: install it (pip install ruff) to score code quality")
