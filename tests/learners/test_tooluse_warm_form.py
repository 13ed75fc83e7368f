"""The warm start's data programs in the form asked (`ToolUseConfig.data_program`, issue 52,
s34): `agentrl learn --set data_program=shown` demonstrates, hints and replays the "shown"
program (`solver.data_program(task, "shown")`), records the form in the checkpoint and the
result, and the default stays canonical. Tiny random model, the real environment."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from agentrl.envs.tooluse import solver
from agentrl.learners.tooluse import (
    ToolUseConfig,
    ToolUseLearner,
    demonstrations,
    task_hint,
    warm_episodes,
)
from agentrl.learners.tooluse_episodes import EpisodeRecord


def _code(reply: str) -> str:
    return str(json.loads(reply)["tool_args"]["code"])


def test_the_warm_starts_data_demonstrations_are_in_the_form_asked() -> None:
    shown = warm_episodes(ToolUseConfig(warm_tasks_per_family=4, data_program="shown"))
    data = [ep for ep in shown if ep.task.family == "data"]
    assert len(data) == 4 and all(ep.success for ep in shown)  # the environment's verdict
    for ep in data:
        code = _code(ep.turns[0].reply)
        assert code == solver.data_program(ep.task, "shown")
        assert code != solver.data_program(ep.task, "canonical")
    # the other families' programs do not depend on the form
    default = warm_episodes(ToolUseConfig(warm_tasks_per_family=4))
    assert [ep.turns[0].reply for ep in shown if ep.task.family != "data"] == [
        ep.turns[0].reply for ep in default if ep.task.family != "data"
    ]
    for ep in (ep for ep in default if ep.task.family == "data"):  # the default: canonical
        assert _code(ep.turns[0].reply) == solver.data_program(ep.task, "canonical")


def test_the_slow_warm_starts_samples_and_the_learners_hints_follow_the_form(
    tmp_path: Path,
) -> None:
    """`warm_fast: false` trains `demonstrations`; RL's hints plan the call in the form."""
    from agentrl.envs.tooluse.tasks import generate_task

    cfg = ToolUseConfig(model="tiny", threads=0, data_program="shown", out_dir=str(tmp_path))
    learner = ToolUseLearner(cfg)
    tok = learner.tokenizer
    samples = demonstrations(learner, [("data", 3), ("data", 5)])
    assert len(samples) == 4  # the call and the answer of each
    for seed, sample in zip((3, 5), samples[::2], strict=True):
        reply = tok.decode(sample.action_ids, skip_special_tokens=True)
        assert _code(reply) == solver.data_program(generate_task(seed, "data"), "shown")
    failed = [EpisodeRecord("data", 7)]  # no reply parsed
    task = generate_task(7, "data")
    hint = task_hint(cfg, ("data", 7), failed)
    assert hint.endswith(f"Reply with {solver.first_reply(task, 'shown')}")
    plain = task_hint(cfg.model_copy(update={"data_program": None}), ("data", 7), failed)
    assert plain.endswith(f"Reply with {solver.first_reply(task, 'canonical')}")


def _learn(tmp_path: Path, name: str, *args: str) -> Path:
    """`agentrl learn` on a tiny warm start (no RL, nothing measured): its out folder."""
    from agentrl.cli import app

    config = tmp_path / "tooluse-tiny.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kind": "tooluse",
                "model": "tiny",
                "max_steps": 2,
                "threads": 0,
                "warm_tasks_per_family": 1,
                "warm_epochs": 1,
                "warm_batch_size": 4,
                "rl_method": "none",
                "heldout_per_family": 1,
                "unseen_per_family": 0,
                "eval_base": False,
                "eval_start": False,
            }
        )
    )
    out = tmp_path / name
    result = CliRunner().invoke(
        app, ["learn", "--config", str(config), "--out", str(out), *args], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return out


def test_agentrl_learn_records_the_form_in_the_checkpoint_and_the_result(tmp_path: Path) -> None:
    from agentrl.app.loop_tooluse import start_data_program
    from agentrl.llm.checkpoint import check_manifest

    shown = _learn(tmp_path, "shown", "--set", "data_program=shown")
    record = json.loads((shown / "result.json").read_text())["record"]
    assert record["data_program"] == "shown"
    ckpt = shown / "checkpoints" / "warmstart"
    check_manifest(ckpt)  # metrics.json is in the manifest, its sha checked
    metrics = json.loads((ckpt / "metrics.json").read_text())
    assert metrics["data_program"] == "shown" and metrics["sft_losses"]
    assert "shown form" in (ckpt / "model_card.md").read_text()
    assert start_data_program(ckpt) == "shown"
    default = _learn(tmp_path, "default")
    assert json.loads((default / "result.json").read_text())["record"]["data_program"] == (
        "canonical"
    )
    assert start_data_program(default / "checkpoints" / "warmstart") == "canonical"


def test_the_option_is_shown_and_a_non_tooluse_config_refuses_it() -> None:
    from agentrl.cli import app

    runner = CliRunner()
    shown = runner.invoke(
        app,
        ["learn", "--config", "configs/tooluse-light.yaml", "--data-program", "shown",
         "--show-config"],
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["data_program"] == "shown"
    assert "--data-program" in runner.invoke(app, ["learn", "--help"]).output
    bad = runner.invoke(app, ["learn", "--set", "data_program=sorted", "--show-config"])
    assert bad.exit_code == 2
    wrong = runner.invoke(
        app, ["learn", "--config", "configs/frozenlake-valid-action.yaml", "--data-program",
              "shown"]
    )  # fmt: skip
    assert wrong.exit_code == 2 and "tool-use setting" in wrong.output
