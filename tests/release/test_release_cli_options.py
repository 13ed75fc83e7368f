"""`agentrl deploy ...` and `agentrl lineage ...` draw their options and arguments from
`agentrl.release.options` (issue 55.3): each field is an argument or an option helped by
its docstring, the flags keep their names (`--from`, `--agent`, `--nats-url`), an action
given no reason writes the one it always wrote, and a refused value exits 2 before the
registry is touched (no NATS server here: nothing is reached)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from agentrl.cli import app
from agentrl.core.configcli import first_sentence
from agentrl.release import cli as deploy_cli
from agentrl.release import lineage_cli
from config_cli_check import RUNNER, shown

ARGS = {"model_id": "m-v1", "percent": "30", "name": "agent0/dev"}  # a value per argument
COMMANDS = [(["deploy", n], m) for n, m, _, _ in deploy_cli.COMMANDS] + [
    (["lineage", n], m) for n, m, _ in lineage_cli.COMMANDS
]


def _arguments(model: type[BaseModel]) -> list[str]:
    return [f for f in ("name", "model_id", "percent") if f in model.model_fields]


@pytest.mark.parametrize(
    ("command", "model"), COMMANDS, ids=lambda c: "-".join(c) if isinstance(c, list) else ""
)
def test_every_field_is_an_argument_or_an_option_helped_by_its_docstring(
    command: list[str], model: type[BaseModel]
) -> None:
    page = RUNNER.invoke(app, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert page.exit_code == 0, page.output
    text = " ".join(page.output.replace("│", " ").split())
    arguments = _arguments(model)
    for name, info in model.model_fields.items():
        assert info.description, f"{model.__name__}.{name} has no docstring"
        flag = {"parent": "--from"}.get(name, "--" + name.replace("_", "-"))
        assert (f"{flag} " in text) != (name in arguments), name  # one or the other
        assert first_sentence(info.description) in text, name
    given = [ARGS[a] for a in arguments]
    got = shown([*command, *given])
    want = model.model_validate({a: ARGS[a] for a in arguments}).model_dump(mode="json")
    assert got == want  # nothing else given: the model's defaults


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (["deploy", "promote"], "manual promote"),
        (["deploy", "rollback"], "manual rollback"),
        (["deploy", "pause"], "paused by a human"),
        (["deploy", "resume"], "resumed by a human"),
        (["deploy", "weight", "30"], "manual ramp"),
        (["lineage", "create", "x"], "created by cli"),
        (["lineage", "pause", "x"], "pause by cli"),
        (["lineage", "resume", "x"], "resume by cli"),
        (["lineage", "retire", "x"], "retire by cli"),
        (["lineage", "map", "x"], "mapped by cli"),
        (["lineage", "rollback", "x"], "manual rollback"),
        (["lineage", "promote", "x"], "manual promote"),
    ],
)
def test_an_action_given_no_reason_writes_the_one_it_always_wrote(
    command: list[str], reason: str
) -> None:
    assert shown(command)["reason"] == reason


def test_the_flags_keep_their_names() -> None:
    got: dict[str, Any] = shown(
        ["lineage", "create", "agent0/sub", "--from", "agent0/dev", "--agent", "coder",
         "--agent", "ops", "--profile", "developer", "--validation", '{"benchmark_seed": 7}',
         "--reason", "why not", "--nats-url", "nats://n:4222"]
    )  # fmt: skip
    assert (got["name"], got["parent"], got["agent"], got["profile"]) == (
        "agent0/sub", "agent0/dev", ["coder", "ops"], ["developer"],
    )  # fmt: skip
    assert (got["reason"], got["nats_url"]) == ("why not", "nats://n:4222")
    assert json.loads(got["validation"]) == {"benchmark_seed": 7}
    got = shown(["deploy", "promote", "m-v2", "--reason", "r", "--by", "bob"])
    assert (got["model_id"], got["reason"], got["by"]) == ("m-v2", "r", "bob")
    assert shown(["deploy", "tensorzero", "--function", "f"])["function"] == "f"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["deploy", "weight", "150"], "less than or equal to 100"),
        (["deploy", "weight", "half"], "percent"),
        (["deploy", "show"], "Missing argument"),
        (["lineage", "create", "x", "--validation", "{bad"], "validation"),  # was a traceback
        (["lineage", "create", "x", "--validation", "[1]"], "a JSON object"),
        (["lineage", "pause"], "Missing argument"),
        (["deploy", "split", "--set", "nope=1"], "FIELD=VALUE"),
    ],
)
def test_bad_input_exits_2_with_the_reason_before_reaching_nats(args: list[str], why: str) -> None:
    # no --show-config: the command runs, so it must refuse before connecting anywhere
    result = RUNNER.invoke(app, [*args, "--nats-url", "nats://127.0.0.1:1"])
    assert result.exit_code == 2 and why in result.output, result.output


def test_each_command_body_runs_on_a_real_registry(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commands the other CLI tests leave out, through a real NATS registry: models,
    split, tensorzero, pause / resume / weight without a rollout (refused, exit 2), and a
    lineage's map, pause and resume."""
    import uuid

    tag = uuid.uuid4().hex[:8]
    monkeypatch.setenv("AGENTRL_DEPLOY_PUBLIC_MODEL", f"pol-{tag}")
    monkeypatch.setenv("AGENTRL_DEPLOY_BUCKET", f"models_{tag}")

    def cli(*args: str) -> Any:
        return RUNNER.invoke(app, [*args, "--nats-url", nats_url])

    res = cli("deploy", "models")
    assert res.exit_code == 0 and json.loads(res.output) == [], res.output
    res = cli("deploy", "split")
    assert json.loads(res.output) == {"split": None, "rollout": None}, res.output
    res = cli("deploy", "tensorzero", "--function", "fn")
    assert res.exit_code == 0 and "[functions.fn.experimentation]" in res.output, res.output
    for args in (["pause"], ["resume"], ["weight", "40"]):
        res = cli("deploy", *args)
        assert res.exit_code == 2 and "refused" in res.output, (args, res.output)
    assert cli("lineage", "create", "team/a").exit_code == 0
    res = cli("lineage", "map", "team/a", "--agent", "coder", "--profile", "dev")
    assert res.exit_code == 0, res.output
    assert (json.loads(res.output)["agents"], json.loads(res.output)["profiles"]) == (
        ["coder"], ["dev"],
    )  # fmt: skip
    assert json.loads(cli("lineage", "pause", "team/a").output)["state"] == "paused"
    assert json.loads(cli("lineage", "resume", "team/a").output)["state"] == "active"
