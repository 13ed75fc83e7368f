"""docs/architecture.md draws the floors of the layering contract (`[tool.importlinter]` in
pyproject.toml, checked by `lint-imports` in scripts/test.sh) in the contract's order, and
the contract holds: no import back up, no circle."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _floors() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    return [name.removeprefix("agentrl.") for name in layers]


def test_the_map_lists_the_packages_in_the_contracts_order() -> None:
    block = (ROOT / "docs" / "architecture.md").read_text().split("```")[1]
    drawn = re.findall(r"^  (\w+)/ ", block, flags=re.M)
    packages = [f for f in _floors() if (ROOT / "src" / "agentrl" / f).is_dir()]
    assert drawn == packages


def test_every_package_of_src_is_on_a_floor() -> None:
    named = {part.strip() for floor in _floors() for part in floor.split("|")}
    named = {n.removeprefix("agentrl.") for n in named}
    src = ROOT / "src" / "agentrl"
    modules = {p.stem for p in src.glob("*.py") if p.stem not in {"__init__", "__main__"}}
    packages = {p.name for p in src.iterdir() if (p / "__init__.py").is_file()}
    assert (modules | packages) - named == set()


def test_the_contract_holds() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is a dev dependency"
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
