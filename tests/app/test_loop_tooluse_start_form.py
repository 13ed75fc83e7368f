"""`agentrl loop --env tooluse --init-checkpoint X` writes its jobs' scripted data programs
in the form X's warm start learned (issue 52, s34): X's metrics.json says it (`agentrl
learn --set data_program=shown`, `ToolUseLearner.save`); an explicit `--set data_program`
wins; a start that records no form leaves the default; the run's print says which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentrl.app.loop_config import LoopConfig, loop_environment
from agentrl.app.loop_tooluse import data_program_line, start_data_program


@pytest.fixture(scope="module")
def starts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Warm-start checkpoints as `agentrl learn` saves them (tiny model, not trained): one in
    each form, and one whose metrics.json records none (a checkpoint from before s34)."""
    from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner

    root = tmp_path_factory.mktemp("starts")
    out: dict[str, Path] = {}
    learner = ToolUseLearner(ToolUseConfig(model="tiny", threads=0, out_dir=str(root / "a")))
    for form in ("shown", "canonical"):
        learner.config = learner.config.model_copy(update={"data_program": form})
        learner.trainer.config.storage_path = str(root / form)
        out[form] = Path(learner.save("warmstart", {"sft_losses": [0.5]}))
    old = root / "old"
    old.mkdir()
    (old / "metrics.json").write_text(json.dumps({"sft_losses": [0.5]}))
    out["old"] = old
    return out


def loop_config(*args: str) -> LoopConfig:
    from agentrl.cli import app

    result = CliRunner().invoke(
        app, ["loop", "--env", "tooluse", "--quick", *args, "--show-config"]
    )
    assert result.exit_code == 0, result.output
    return LoopConfig.model_validate_json(result.output)


def job_forms(cfg: LoopConfig) -> tuple[Any, Any]:
    """(the hints' data program form, the replay's) in the jobs' hyperparameters."""
    hyper = json.loads(loop_environment(cfg)["AGENTRL_TRAINING_HYPERPARAMETERS"])
    return hyper["tooluse_hints"].get("data_program"), hyper["tooluse_replay"].get("data_program")


def test_the_loop_takes_the_form_its_warm_start_learned(starts: dict[str, Path]) -> None:
    assert start_data_program(starts["shown"]) == "shown"
    cfg = loop_config("--init-checkpoint", str(starts["shown"]))
    assert cfg.data_program == "shown"
    assert job_forms(cfg) == ("shown", "shown")
    assert "write the shown form (the warm start's" in data_program_line(cfg)
    # the profile itself, as a script builds it
    assert LoopConfig.tooluse(init_checkpoint=str(starts["shown"])).data_program == "shown"


def test_an_explicit_form_wins_over_the_warm_starts(starts: dict[str, Path]) -> None:
    cfg = loop_config("--init-checkpoint", str(starts["shown"]), "--set", "data_program=canonical")
    assert cfg.data_program == "canonical"
    assert job_forms(cfg) == ("canonical", "canonical")
    assert "set here; the warm start learned the shown form" in data_program_line(cfg)
    other = loop_config(
        "--init-checkpoint", str(starts["canonical"]), "--set", "data_program=shown"
    )
    assert other.data_program == "shown"


def test_a_start_without_a_recorded_form_and_no_start_keep_the_default(
    starts: dict[str, Path],
) -> None:
    assert loop_config("--init-checkpoint", str(starts["canonical"])).data_program == "canonical"
    for cfg in (loop_config("--init-checkpoint", str(starts["old"])), loop_config()):
        assert cfg.data_program is None
        assert job_forms(cfg) == (None, None)
        assert "write the canonical form" in data_program_line(cfg)
    assert "does not record its form" in data_program_line(
        loop_config("--init-checkpoint", str(starts["old"]))
    )
    assert start_data_program(starts["old"] / "missing") is None
    assert start_data_program("s3://bucket/ckpt") is None
