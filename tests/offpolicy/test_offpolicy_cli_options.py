"""`agentrl dqn` draws its options from the training config (`AGMConfigEntity`'s top-level
keys) and `DqnRun`, `bench dqn|per` from `agentrl.offpolicy.options` (issue 55.3): each is
helped by its field's docstring, `--set SECTION.KEY=VALUE` reaches every key of the YAML,
and a refused value exits 2 naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.core.configcli import first_sentence
from agentrl.offpolicy.cli import CONFIG_OPTIONS
from agentrl.offpolicy.config import AGMConfigEntity, load_config
from agentrl.offpolicy.options import DqnBench, DqnRun, PerBench

REPO = Path(__file__).resolve().parents[2]
RUNNER = CliRunner()


def _help(command: list[str]) -> str:
    page = RUNNER.invoke(app, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert page.exit_code == 0, page.output
    return " ".join(page.output.replace("│", " ").split())


def _flags(model: type[BaseModel], name: str) -> str:
    flag = {"metrics_format": "format"}.get(name, name).replace("_", "-")
    return f"--no-{flag}" if model.model_fields[name].default is True else f"--{flag}"


@pytest.mark.parametrize(
    ("command", "model", "names"),
    [
        (["dqn"], DqnRun, list(DqnRun.model_fields)),
        (["dqn"], AGMConfigEntity, list(CONFIG_OPTIONS)),
        (["bench", "dqn"], DqnBench, list(DqnBench.model_fields)),
        (["bench", "per"], PerBench, list(PerBench.model_fields)),
    ],
)
def test_the_options_are_the_fields_helped_by_their_docstrings(
    command: list[str], model: type[BaseModel], names: list[str]
) -> None:
    text = _help(command)
    for name in names:
        info = model.model_fields[name]
        assert f"{_flags(model, name)} " in text, name
        assert info.description and first_sentence(info.description).lower() in text.lower()
    assert "--set" in text and "(0:" not in text


def test_set_reaches_every_section_key_and_options_override_the_yaml() -> None:
    args = ["dqn", "-c", str(REPO / "configs/cartpole.yaml"), "--seed", "3", "--total-steps",
            "1500", "--set", "replay.alpha=0.5", "--set", "network.hidden=[32, 32]",
            "--set", "kernel_smoothing.enabled=true", "--show-config"]  # fmt: skip
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 0, result.output
    got = AGMConfigEntity.model_validate_json(result.output)
    base = load_config(REPO / "configs/cartpole.yaml")
    assert (got.seed, got.total_steps, got.replay.alpha) == (3, 1500, 0.5)
    assert got.network.hidden == (32, 32) and got.kernel_smoothing.enabled
    assert got.dqn == base.dqn and got.env_id == base.env_id  # the rest: the YAML's


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["dqn", "--set", "replay.alpha=7"], "[0, 1]"),
        (["dqn", "--set", "replay.nope=1"], "replay.nope"),
        (["dqn", "--set", "nope.x=1"], "SECTION.KEY"),
        (["dqn", "--seed", "-1"], "seed"),
        (["dqn", "--actors", "0"], "actors"),
        (["dqn", "--format", "xml"], "--format"),
        (["dqn", "--config", "missing.yaml"], "not found"),
        (["bench", "per", "--capacity", "10"], "capacity"),
        (["bench", "dqn", "--seeds", "0"], "seeds"),
    ],
)
def test_bad_input_exits_2_naming_the_key(args: list[str], why: str) -> None:
    result = RUNNER.invoke(app, [*args, "--show-config"])
    assert result.exit_code == 2 and why in result.output, result.output
