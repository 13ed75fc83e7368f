"""What every config-drawn command must show (issue 55.3), shared by the packages' CLI tests:
each field of its options model is an option helped by its docstring's first sentence, or
reachable through `--set`; nothing given means the model's values; no "0 means default"."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.core.configcli import first_sentence

RUNNER = CliRunner()


def shown(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The settings a command would run with (`--show-config`; a warning may come first)."""
    result = RUNNER.invoke(app, [*args, "--show-config"], env=env)
    assert result.exit_code == 0, result.output
    out = result.output
    return dict(json.loads(out[out.index("{") :]))


def check_fields(
    command: list[str],
    model: type[BaseModel],
    *,
    every_option: bool = False,
    all_described: bool = False,
    env: dict[str, str] | None = None,
) -> str:
    """Assert the command's options are drawn from `model`; returns its help text."""
    page = RUNNER.invoke(app, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert page.exit_code == 0, page.output
    text = " ".join(page.output.replace("│", " ").split())
    defaults = json.loads(model().model_dump_json())
    assert shown(command, env) == defaults  # nothing given: the model's values
    for name, info in model.model_fields.items():
        flag = name.replace("_", "-")
        assert info.description or not all_described, f"{model.__name__}.{name}: no docstring"
        negated = every_option and f"--no-{flag} " in text  # a flag whose default is on
        if f"--{flag} " in text or negated:  # an option, helped by its docstring
            help_ = first_sentence(info.description).lower()  # "Off: ..." for --no-FIELD
            assert info.description and help_ in text.lower(), name
        else:  # the others through --set
            assert not every_option, f"{name} is not an option"
            value = json.dumps(defaults[name])
            assert shown([*command, "--set", f"{name}={value}"], env) == defaults, name
    assert "(0:" not in text
    return text
