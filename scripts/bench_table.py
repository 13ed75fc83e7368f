"""Draw BENCHMARKS.md's "Current figures" table and the README's result table from the
benchmark results file, `docs/bench/results.jsonl`.

The results file is the data: one JSON object a recorded run (`bench`, `title`, `figure`,
`where`, `target`, `met`, `links`, `date`, and, where the run printed one, its last JSON
line under `json`; `context` keeps what the figure cell leaves out, such as earlier runs).
It only grows: a newer record of a benchmark replaces the older one in the tables, and the
history stays in the file and in the month's narrative (`docs/bench/YYYY-MM.md`). Add a record, then run

    python scripts/bench_table.py          # rewrite both tables
    python scripts/bench_table.py --check  # exit 1 when a table is out of date (the tests do)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "bench" / "results.jsonl"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
# the README shows these benchmarks only, in this order
HEADLINE = ["loop", "loop-lineages", "tooluse-learn", "soak", "soak-replicas", "bench-canary", "bench-capture",
            "bench-gateway-peers", "test-suite"]  # fmt: skip


def latest(path: Path = RESULTS) -> dict[str, dict]:
    """Each benchmark's newest record, in the order benchmarks first appear in the file."""
    rows: dict[str, dict] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{path}:{n}: not JSON ({exc})") from exc
        missing = {"bench", "title", "figure", "where", "target", "met"} - rec.keys()
        if missing:
            raise SystemExit(f"{path}:{n}: missing {sorted(missing)}")
        rows[rec["bench"]] = rec  # a later record replaces an earlier one
    return rows


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _met(rec: dict) -> str:
    met = str(rec["met"])
    return f"**{met}**" if met.startswith("no") else met


def benchmarks_table(rows: dict[str, dict]) -> str:
    lines = [
        "| benchmark | latest figure | host, date (UTC), load | target | met? | history |",
        "|---|---|---|---|---|---|",
    ]
    for rec in rows.values():
        links = ", ".join(f"[{x}][{x}]" for x in rec.get("links", []))
        cells = [rec["title"], rec["figure"], rec["where"], rec["target"], _met(rec), links]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    failing = [rec["title"] for rec in rows.values() if str(rec["met"]).startswith("no")]
    lines += ["", "Rows that say **no** today: " + "; ".join(failing) + "." if failing else ""]
    return "\n".join(lines).rstrip() + "\n"


def readme_table(rows: dict[str, dict]) -> str:
    lines = ["| benchmark | latest figure | target | met? |", "|---|---|---|---|"]
    for key in HEADLINE:
        if key in rows:
            rec = rows[key]
            cells = [rec["title"], rec["figure"], rec["target"], _met(rec)]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines.append("")
    lines.append("Every benchmark, with host, date and load: [BENCHMARKS.md](BENCHMARKS.md).")
    return "\n".join(lines) + "\n"


def splice(text: str, block: str, name: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{name} has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only say whether the tables are current")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    rows = latest(args.root / "docs" / "bench" / "results.jsonl")
    stale = []
    for name, block in (
        ("BENCHMARKS.md", benchmarks_table(rows)),
        ("README.md", readme_table(rows)),
    ):
        path = args.root / name
        old = path.read_text()
        new = splice(old, block, name)
        if new != old:
            stale.append(name)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(
            f"out of date: {', '.join(stale)}; run python scripts/bench_table.py", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
