"""The training commands' options are drawn from `agentrl.training.options` (issue 55.3): each
chosen field is an option helped by its docstring, `--set` reaches the others, unset options
keep the model's values (`--quick`'s), and a refused value exits 2."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from agentrl.cli import app
from agentrl.training.cli import request_body
from agentrl.training.options import (
    Connection,
    ListOptions,
    ServeOptions,
    StartOptions,
    StatusOptions,
    TrainingBench,
)
from config_cli_check import RUNNER, check_fields, shown

COMMANDS = [
    (["train", "start"], StartOptions),
    (["train", "status", "JOB"], StatusOptions),
    (["train", "cancel", "JOB"], Connection),
    (["train", "list"], ListOptions),
    (["train", "serve"], ServeOptions),
    (["bench", "training"], TrainingBench),
]


def _shown(args: list[str]) -> dict[str, object]:
    return shown(args, env={"AGENTRL_API_TOKEN": ""})


@pytest.mark.parametrize(("command", "model"), COMMANDS)
def test_every_field_is_reachable_and_helped_by_its_docstring(
    command: list[str], model: type[BaseModel]
) -> None:
    text = check_fields(command, model, env={"AGENTRL_API_TOKEN": ""})
    assert "--set" in text


def test_options_keep_their_names_and_build_the_request() -> None:
    got = _shown(
        ["train", "start", "--base-model", "tiny", "--estimator", "gigpo", "--priority", "high",
         "--min-reward", "0.5", "--sample-size", "7", "--env", "frozenlake-4x4",
         "--iterations", "3", "--follow", "--nats", "nats://x:4222", "--token", "s3cret"]
    )  # fmt: skip
    assert got["token"] == "***"  # a secret is masked
    body = request_body(StartOptions.model_validate({**got, "token": None}))
    tc = body["training_config"]
    assert (tc["base_model"], tc["hyperparameters"], body["priority"]) == (
        "tiny", {"adv_estimator": "gigpo"}, "high",
    )  # fmt: skip
    assert tc["dataset"] == {"sample_size": 7, "filter": {"min_reward": 0.5}}
    assert tc["environment"] == {"env_id": "frozenlake-4x4", "iterations": 3}
    assert _shown(["train", "status", "J", "-f"])["follow"] is True
    assert _shown(["bench", "training", "--quick", "--jobs", "4"]) == {
        **TrainingBench.quick().model_dump(), "jobs": 4,
    }  # fmt: skip
    assert _shown(["bench", "training"])["trajectories"] == 100_000


@pytest.mark.parametrize(
    "args",
    [
        ["train", "start", "--sample-size", "0"],  # no "0 means default" any more
        ["train", "start", "--priority", "asap"],
        ["train", "start", "--set", "nope=1"],
        ["bench", "training", "--jobs", "0"],
        ["bench", "training", "--set", "job_seconds=-1"],
    ],
)
def test_bad_input_exits_2(args: list[str]) -> None:
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 2, result.output
