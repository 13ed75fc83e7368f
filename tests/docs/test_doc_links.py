"""Every relative link in README.md, BENCHMARKS.md, CHANGELOG.md and docs/ points at something."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_links", ROOT / "scripts" / "check_links.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_links"] = module
    spec.loader.exec_module(module)
    return module


def test_every_relative_link_of_the_docs_resolves() -> None:
    checker = _checker()
    assert len(checker.documents()) > 10
    assert checker.broken() == []


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    checker = _checker()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A guide\n\n## The `loop` — story (2026-11-25)\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok too](docs/a.md#the-loop--story-2026-11-25)\n"
        "[gone](docs/b.md) [no heading](docs/a.md#nowhere) `[in code](docs/c.md)`\n"
        "[ref]: docs/d.png\n\n```\n[in a block](docs/e.md)\n```\n"
    )
    problems = checker.broken(tmp_path)
    assert problems == [
        "README.md:2: docs/b.md (no such file)",
        "README.md:2: docs/a.md#nowhere (no heading #nowhere)",
        "README.md:3: docs/d.png (no such file)",
    ]
