#!/usr/bin/env python3
"""Every relative link (inline or a reference definition) in README.md, BENCHMARKS.md, CHANGELOG.md and docs/**/*.md must point at
a file or folder that exists, and a `#anchor` at a heading of the target (GitHub's slugs).

    python scripts/check_links.py          # prints each broken link, exit code 1 if any

Links inside code blocks and inline code are ignored; http(s) and mailto links are not checked.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")


def documents(root: Path = ROOT) -> list[Path]:
    docs = [root / name for name in ("README.md", "BENCHMARKS.md", "CHANGELOG.md")]
    return [p for p in docs if p.exists()] + sorted((root / "docs").rglob("*.md"))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    in_code = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        ref = REFERENCE.match(line)
        if ref:
            found.append((number, ref.group(1).strip("<>")))
            continue
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            found.append((number, m.group(1)))
    return found


def broken(root: Path = ROOT) -> list[str]:
    problems: list[str] = []
    for doc in documents(root):
        for number, target in links(doc):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            where = f"{doc.relative_to(root)}:{number}: {target}"
            if not dest.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where} (no heading #{anchor})")
    return problems


def main() -> int:
    problems = broken()
    for line in problems:
        print(line)
    checked = sum(len(links(d)) for d in documents())
    print(f"{len(problems)} broken of {checked} links in {len(documents())} files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
