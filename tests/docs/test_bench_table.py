"""BENCHMARKS.md's current table and the README's result table are drawn from the results
file (`docs/bench/results.jsonl`) and kept in step with it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_table", ROOT / "scripts" / "bench_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_table"] = module
    spec.loader.exec_module(module)
    return module


def test_the_tables_in_the_repo_are_current() -> None:
    assert _tables().main(["--check"]) == 0, "run python scripts/bench_table.py"


def _record(bench: str, figure: str, met: str = "yes") -> str:
    rec = {"bench": bench, "title": f"`{bench}`", "figure": figure, "where": "here",
           "target": "t", "met": met}  # fmt: skip
    return json.dumps(rec)


def _repo(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / "docs" / "bench").mkdir(parents=True)
    (tmp_path / "docs" / "bench" / "results.jsonl").write_text("\n".join(lines) + "\n")
    block = "<!-- results:begin -->\n<!-- results:end -->\n"
    (tmp_path / "BENCHMARKS.md").write_text("# B\n\n" + block)
    (tmp_path / "README.md").write_text("# R\n\n" + block)
    return tmp_path


def test_a_newer_record_replaces_the_older_and_no_rows_are_listed(tmp_path: Path) -> None:
    tables = _tables()
    root = _repo(
        tmp_path,
        [_record("a", "old figure"), _record("soak", "ok", "no"), _record("a", "new | figure")],
    )
    assert tables.main(["--root", str(root), "--check"]) == 1  # blocks still empty
    assert tables.main(["--root", str(root)]) == 0
    assert tables.main(["--root", str(root), "--check"]) == 0
    bench = (root / "BENCHMARKS.md").read_text()
    assert "new \\| figure" in bench and "old figure" not in bench
    assert bench.index("`a`") < bench.index("`soak`")  # first appearance keeps the order
    assert "Rows that say **no** today: `soak`." in bench
    readme = (root / "README.md").read_text()
    assert "`soak`" in readme and "`a`" not in readme  # only the headline benchmarks


def test_a_bad_record_is_named_by_its_line(tmp_path: Path) -> None:
    tables = _tables()
    root = _repo(tmp_path, [_record("a", "x"), '{"bench": "b"}'])
    with pytest.raises(SystemExit, match=r"results.jsonl:2: missing"):
        tables.main(["--root", str(root)])
