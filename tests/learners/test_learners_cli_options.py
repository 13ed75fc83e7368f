"""`agentrl learn`, `train-sft` and `train-policy` draw their options from
`agentrl.learners.options` (issue 55.3): each field is an option helped by its docstring,
unset options keep the model's values (`learn`: the config file's), a refused value exits 2."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from agentrl.cli import app
from agentrl.learners.options import LearnOptions, PolicyOptions, SFTOptions
from config_cli_check import RUNNER, check_fields, shown

COMMANDS = [
    (["learn"], LearnOptions),
    (["train-sft"], SFTOptions),
    (["train-policy"], PolicyOptions),
]


_shown = shown


@pytest.mark.parametrize(("command", "model"), COMMANDS)
def test_every_field_is_an_option_helped_by_its_docstring(
    command: list[str], model: type[BaseModel]
) -> None:
    check_fields(command, model, every_option=True)


def test_options_keep_their_names() -> None:
    got = _shown(
        ["train-sft", "--model", "tiny", "--train-maps", "2", "--heldout-maps", "2",
         "--epochs", "1", "--max-steps", "2", "--lora-r", "0", "--out", "o"]
    )  # fmt: skip
    assert (got["train_maps"], got["lora_r"], got["out"]) == (2, 0, "o")
    learn = _shown(["learn", "--model", "tiny", "--iterations", "1", "--heldout-seeds", "2"])
    assert (learn["model"], learn["iterations"], learn["seed"]) == ("tiny", 1, None)
    policy = _shown(["train-policy", "--resume", "--s3-endpoint", "http://m:9000"])
    assert (policy["resume"], policy["s3_endpoint"], policy["storage_path"]) == (
        True, "http://m:9000", None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ["learn", "--iterations", "0"],
        ["learn", "--set", "nope=1"],
        ["train-sft", "--epochs", "0"],
        ["train-policy", "--temperature", "0"],
        ["train-policy", "--nproc", "zero"],
    ],
)
def test_bad_input_exits_2(args: list[str]) -> None:
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 2, result.output
