"""`agentrl.core.configcli` on a small model of its own, through a real typer app: fields
become options helped by their docstrings, `arguments` fields positional arguments, a
required field a required option, flags on/off, `--set` the rest; nothing given leaves the
model's defaults, and a refused value exits 2 with the model's reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
import typer
from pydantic import BaseModel, ConfigDict, Field
from typer.testing import CliRunner

from agentrl.core.configcli import config_command, first_sentence, overrides

RUNNER = CliRunner()


class Inner(BaseModel):
    size: int = 1


class Opts(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    name: str
    """The thing's name. More words the help leaves out."""
    version: str | None = None
    """One of its versions (default: the newest)."""
    out: Path
    """Where it goes."""
    mode: Literal["fast", "slow"] = "fast"
    """How it runs."""
    tags: list[str] = []
    """A tag."""
    workers: int | None = Field(None, ge=1)
    """Worker processes (default: one per core)."""
    pace: bool = True
    """Wait between steps."""
    loud: bool = False
    """Say more."""
    inner: Inner = Inner()
    """A section only --set reaches."""


def _app(seen: list[Opts]) -> typer.Typer:
    app = typer.Typer()
    app.command("go")(config_command(Opts, None, seen.append, arguments=("name", "version")))

    @app.command("other")
    def other() -> None:  # a second command keeps `go` a subcommand
        """Nothing."""

    return app


def _go(*args: str) -> tuple[int, str, list[Opts]]:
    seen: list[Opts] = []
    result = RUNNER.invoke(_app(seen), ["go", *args], env={"COLUMNS": "200", "NO_COLOR": "1"})
    return result.exit_code, result.output, seen


def test_fields_are_arguments_and_options_helped_by_their_docstrings() -> None:
    code, page, _ = _go("--help")
    assert code == 0, page
    text = " ".join(page.replace("│", " ").split())
    assert "[OPTIONS] {name} [version]" in text  # name required, version optional
    for flag in ("--out", "--mode", "--tags", "--workers", "--no-pace", "--loud", "--set"):
        assert f"{flag} " in text, flag
    assert "--name" not in text and "--version" not in text and "--inner" not in text
    assert "The thing's name." in text and "More words" not in text  # the first sentence
    assert first_sentence(Opts.model_fields["workers"].description) in text
    assert "Off: wait between steps." in text and "A tag. Repeatable." in text
    assert "--out" in text and "[required]" in text
    assert "How it runs. [default: fast]" in text  # a value; None, [] and flags show none
    assert "[default: None]" not in text and "[default: []]" not in text


class Sized(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    rows: int = 1000
    """Rows to write."""

    @classmethod
    def quick(cls, **kw: int) -> Sized:
        """A few rows."""
        return cls(**{"rows": 10, **kw})


def test_a_quick_profile_hides_the_defaults_it_changes() -> None:
    seen: list[Sized] = []
    app = typer.Typer()
    app.command("go")(config_command(Sized, None, seen.append))
    app.command("other")(lambda: None)
    page = RUNNER.invoke(app, ["go", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert "Rows to write." in page.output and "[default:" not in page.output
    assert "A few rows." in page.output  # --quick's help
    assert RUNNER.invoke(app, ["go", "--quick", "--rows", "5"]).exit_code == 0
    assert RUNNER.invoke(app, ["go", "--quick"]).exit_code == 0
    assert [s.rows for s in seen] == [5, 10]


def test_nothing_given_keeps_the_defaults_and_each_value_lands_in_its_field() -> None:
    code, out, seen = _go("n", "--out", "o")
    assert code == 0, out
    assert seen == [Opts(name="n", out=Path("o"))]
    code, out, seen = _go(
        "n", "v2", "--out", "o", "--mode", "slow", "--tags", "a", "--tags", "b",
        "--workers", "3", "--no-pace", "--loud", "--set", "inner={\"size\": 4}",
    )  # fmt: skip
    assert code == 0, out
    assert seen[0].model_dump() == {
        "name": "n", "version": "v2", "out": Path("o"), "mode": "slow", "tags": ["a", "b"],
        "workers": 3, "pace": False, "loud": True, "inner": {"size": 4},
    }  # fmt: skip


def test_show_config_prints_the_settings_and_runs_nothing() -> None:
    code, out, seen = _go("n", "--out", "o", "--workers", "2", "--show-config")
    assert code == 0 and seen == []
    assert json.loads(out) == {**json.loads(Opts(name="n", out=Path("o")).model_dump_json()),
                               "workers": 2}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--out", "o"], "Missing argument"),  # no NAME
        (["n"], "Missing option '--out'"),
        (["n", "--out", "o", "--workers", "0"], "greater than or equal to 1"),  # no "0: default"
        (["n", "--out", "o", "--mode", "warp"], "warp"),
        (["n", "--out", "o", "--set", "nope=1"], "FIELD=VALUE"),
        (["n", "--out", "o", "--set", "inner.nope=1"], "nope"),
    ],
)
def test_a_refused_value_exits_2_with_the_reason(args: list[str], why: str) -> None:
    code, out, seen = _go(*args)
    assert code == 2 and why in out and seen == [], out


def test_overrides_keeps_only_what_was_given() -> None:
    given = {"out": None, "tags": [], "no_pace": False, "loud": False, "workers": 2, "set_": None}
    assert overrides(Opts, given) == {"workers": 2}
    assert overrides(Opts, {"no_pace": True, "loud": True, "set_": ["mode=\"slow\""]}) == {
        "pace": False, "loud": True, "mode": "slow",
    }  # fmt: skip
