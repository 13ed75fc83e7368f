"""`agentrl loop`'s options are drawn from `LoopConfig` (issue 55.3): one option per chosen
field with its docstring as help, `--set` for every other field, no option whose 0 means
"the default", and a help page of at most 40 lines at 80 columns."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentrl.app.cli import LOOP_OPTIONS
from agentrl.app.loop_config import LoopConfig
from agentrl.cli import app

RUNNER = CliRunner()


def _config(*args: str) -> dict[str, object]:
    result = RUNNER.invoke(app, ["loop", *args, "--show-config"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def test_the_help_is_one_screen_and_every_field_is_reachable() -> None:
    result = RUNNER.invoke(app, ["loop", "--help"], env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    lines = result.output.rstrip("\n").splitlines()
    assert len(lines) <= 40, result.output
    for name in LOOP_OPTIONS:  # each chosen field has its option, helped by its docstring
        info = LoopConfig.model_fields[name]
        flag = name.replace("_", "-")
        flag = f"--no-{flag}" if info.default is True else f"--{flag}"
        assert flag in result.output, flag
        assert info.description, f"LoopConfig.{name} has no docstring"
    assert "--set" in result.output and "(0:" not in result.output


def test_unset_options_keep_the_profiles_values() -> None:
    assert _config() == json.loads(LoopConfig().model_dump_json())
    assert _config("--quick") == json.loads(LoopConfig.quick().model_dump_json())
    tool = _config("--env", "tooluse", "--quick")
    assert tool == json.loads(LoopConfig.tooluse(quick=True).model_dump_json())
    vllm = _config("--backend", "vllm")
    assert vllm == json.loads(LoopConfig.on_vllm().model_dump_json())


def test_options_flags_and_set_override_the_profile() -> None:
    got = _config(
        "--quick",
        "--threshold", "5",
        "--until-benchmark", "0",  # 0 is a value here, not "the default"
        "--no-pace",
        "--bad-candidate",
        "--set", "epochs=3",
        "--set", "ramp=[25, 100]",
        "--set", "objective=rs",
    )  # fmt: skip
    assert (got["threshold"], got["until_benchmark"], got["pace"]) == (5, 0.0, False)
    assert (got["bad_candidate"], got["epochs"], got["objective"]) == (True, 3, "rs")
    assert got["ramp"] == [25.0, 100.0] and got["model"] == "tiny"
    assert LoopConfig.quick().until_benchmark == 0.0 and LoopConfig().until_benchmark == 0.6
    assert _config("--until-benchmark", "0")["until_benchmark"] == 0.0


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--set", "nope=1"], "FIELD=VALUE"),
        (["--set", "epochs"], "FIELD=VALUE"),
        (["--env", "chess"], "chess"),
        (["--set", "agents=many"], "agents"),
    ],
)
def test_bad_options_are_refused_with_the_reason(args: list[str], why: str) -> None:
    result = RUNNER.invoke(app, ["loop", *args, "--show-config"])
    assert result.exit_code == 2 and why in result.output, result.output


def test_the_soak_command_is_drawn_from_soak_config_too() -> None:
    from agentrl.bench.cli import SOAK_OPTIONS
    from agentrl.bench.soak_config import SoakConfig

    result = RUNNER.invoke(app, ["soak", "--help"], env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0 and len(result.output.splitlines()) <= 40, result.output
    for name in SOAK_OPTIONS:
        assert f"--{name.replace('_', '-')}" in result.output
    args = ["soak", "--replicas", "2", "--set", "lease_ttl_s=20", "--show-config"]
    got = RUNNER.invoke(app, args)
    assert got.exit_code == 0, got.output
    cfg = SoakConfig.model_validate_json(got.output)
    assert (cfg.replicas, cfg.lease_ttl_s, cfg.agents) == (2, 20.0, SoakConfig().agents)
    refused = RUNNER.invoke(app, ["soak", "--replicas", "0", "--show-config"])
    assert refused.exit_code == 2 and "replicas" in refused.output
