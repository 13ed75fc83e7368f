"""`agentrl bench trainer|learning|learning-freeform` draw their options from
`agentrl.evaluation.options` (issue 55.3): each field is an option helped by its docstring,
unset options keep the model's defaults, no option's 0 means "the default", and a refused
value exits 2."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from agentrl.cli import app
from agentrl.evaluation.options import FreeformBench, LearningBench, TrainerBench
from config_cli_check import RUNNER, check_fields, shown

COMMANDS = [
    (["bench", "trainer"], TrainerBench),
    (["bench", "learning"], LearningBench),
    (["bench", "learning-freeform"], FreeformBench),
]


_shown = shown


@pytest.mark.parametrize(("command", "model"), COMMANDS)
def test_every_field_is_an_option_helped_by_its_docstring(
    command: list[str], model: type[BaseModel]
) -> None:
    text = check_fields(command, model, every_option=True)
    assert "--set" in text


def test_the_documented_invocations_keep_working() -> None:
    got = _shown(
        ["bench", "learning", "--settings", "fl4", "--fl4-every-algorithm", "--algorithms",
         "gigpo,grpo", "--seeds", "5", "--jobs", "2", "--threads", "1", "--out", "runs/x"]
    )  # fmt: skip
    assert (got["settings"], got["fl4_every_algorithm"], got["jobs"], got["threads"]) == (
        "fl4", True, 2, 1,
    )  # fmt: skip
    assert _shown(["bench", "learning"])["threads"] is None  # unset: by the load, not "0"
    trainer = _shown(["bench", "trainer", "--cases", "tiny,smollm2-lora", "--rounds", "3"])
    assert (trainer["cases"], trainer["threads"]) == ("tiny,smollm2-lora", None)
    free = _shown(["bench", "learning-freeform", "--envs", "sokoban", "--iterations", "3"])
    assert (free["envs"], free["iterations"], free["group_size"]) == ("sokoban", 3, 4)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["bench", "trainer", "--threads", "0", "--show-config"], "threads"),
        (["bench", "trainer", "--rounds", "0", "--show-config"], "rounds"),
        (["bench", "learning", "--iterations-scale", "0", "--show-config"], "iterations_scale"),
        (["bench", "learning-freeform", "--group-size", "1", "--show-config"], "group_size"),
        (["bench", "learning", "--quick", "--settings", "chess", "--out", "/nonexistent"], "chess"),
        (["bench", "trainer", "--cases", "huge", "--rounds", "1"], "huge"),
    ],
)
def test_bad_input_exits_2_with_the_reason(args: list[str], why: str) -> None:
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 2 and why in result.output, result.output
