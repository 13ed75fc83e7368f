"""`agentrl agent-zero ...` draws its options from `agentrl.integrations.agent_zero.options`
(issue 55.3): each field is an option helped by its docstring, unset options keep the model's
values, tokens are masked in --show-config, and a refused value exits 2."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.core.configcli import first_sentence
from agentrl.integrations.agent_zero.options import (
    FeedbackOptions,
    FlushOptions,
    InstallOptions,
    ListenOptions,
)

RUNNER = CliRunner()
COMMANDS = [
    (["agent-zero", "install", "A0"], InstallOptions),
    (["agent-zero", "flush", "A0"], FlushOptions),
    (["agent-zero", "feedback", "A0", "T", "rating"], FeedbackOptions),
    (["agent-zero", "listen", "A0"], ListenOptions),
]


def _shown(args: list[str]) -> dict[str, object]:
    result = RUNNER.invoke(app, [*args, "--show-config"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


@pytest.mark.parametrize(("command", "model"), COMMANDS)
def test_every_field_is_an_option_helped_by_its_docstring(
    command: list[str], model: type[BaseModel]
) -> None:
    page = RUNNER.invoke(app, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert page.exit_code == 0, page.output
    text = " ".join(page.output.replace("│", " ").split())
    assert _shown(command) == json.loads(model().model_dump_json())
    for name, info in model.model_fields.items():
        flag = f"--{'no-' if info.default is True else ''}{name.replace('_', '-')} "
        assert flag in text, name
        assert info.description, name
        assert first_sentence(info.description).lower() in text.lower(), name  # "Off: ..."


def test_the_guides_install_line_keeps_working() -> None:
    got = _shown(
        ["agent-zero", "install", "A0", "--gateway-url", "http://g:8000/v1", "--nats-url",
         "nats://n:4222", "--api-url", "http://a:8600", "--api-token", "t", "--no-client",
         "--layout", "plugin", "--python", "/py"]
    )  # fmt: skip
    assert (got["gateway_url"], got["nats_url"], got["api_url"]) == (
        "http://g:8000/v1", "nats://n:4222", "http://a:8600",
    )  # fmt: skip
    assert (got["api_token"], got["client"], got["layout"], got["python"]) == (
        "***", False, "plugin", "/py",
    )  # fmt: skip
    assert InstallOptions.model_validate({**got, "api_token": "t"}).urls() == {
        "gateway_url": "http://g:8000/v1", "nats_url": "nats://n:4222",
        "api_url": "http://a:8600", "api_token": "t",
    }  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ["agent-zero", "install", "A0", "--layout", "flat"],
        ["agent-zero", "install", "A0", "--set", "nope=1"],
        ["agent-zero", "flush", "A0", "--timeout", "0"],
        ["agent-zero", "feedback", "A0", "T", "rating", "--rating", "6"],
        ["agent-zero", "listen", "A0", "--set", "durable="],
    ],
)
def test_bad_input_exits_2(args: list[str]) -> None:
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 2, result.output
