"""The `agentrl dqn` and `agentrl bench per` commands, run as real subprocesses; the training
run goes through the same app in this process (typer's runner)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENTRL = [sys.executable, "-m", "agentrl.cli"]


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AGENTRL, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_dqn_command_writes_metrics_figure_and_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """600 steps, evaluated and learning from 200 (1,500 and 500 before: the same files, two
    evaluations and rows of metrics; 11.8 -> 10.0 CPU-s at load 6.5, 2026-11-30). The command
    runs through its own app in this process (typer's runner): a new Python's imports of
    torch, gymnasium and matplotlib were most of its 9.2 CPU-s; in a process that has them
    it is 2.3-4.9 (the first run imports what torch's optimizer needs), 2026-11-30, load 7.
    The other tests here still start `python -m agentrl.cli` as a process."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    monkeypatch.chdir(REPO)  # the config's path, as the subprocesses run
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "dqn", "--config", "configs/cartpole.yaml", "--seed", "3", "--total-steps", "600", "--out", str(out),
        "--set", "evaluation.every_env_steps=200", "--set", "evaluation.episodes=2", "--set", "dqn.learning_starts=200",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output[-2000:]
    for name in ("metrics.csv", "evals.csv", "training.png", "model.pt", "summary.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] >= 600 and summary["config"]["seed"] == 3
    assert "done" in result.stdout


def test_dqn_command_reports_bad_config_values(tmp_path: Path) -> None:
    proc = run(
        "dqn",
        "--config",
        "configs/cartpole.yaml",
        "--set",
        "replay.alpha=7",
        "--out",
        str(tmp_path),
    )
    assert proc.returncode != 0
    assert "replay.alpha" in proc.stderr + proc.stdout and "[0, 1]" in proc.stderr + proc.stdout


def test_bench_per_prints_json_last(tmp_path: Path) -> None:
    proc = run("bench", "per", "--capacity", "20000", "--iters", "200")
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["benchmark"] == "offpolicy-per" and last["capacity"] == 20000
    assert 0 < last["per_sample_update_ms"] < last["python_loop_sample_update_ms"]


def test_help_teaches() -> None:
    proc = run("dqn", "--help")
    assert proc.returncode == 0 and "--apex" in proc.stdout and "--config" in proc.stdout


def test_bench_dqn_reports_every_figure(tmp_path: Path) -> None:
    """A miniature `bench dqn` (tiny budgets): three agents run and every JSON figure is there."""
    from agentrl.bench.dqn import bench_dqn
    from agentrl.offpolicy.config import load_config

    cfg = load_config(REPO / "configs" / "cartpole.yaml")
    small = cfg.model_dump(mode="json")
    # 600 steps each (1,200 before: 3.5 -> 1.3 CPU-s measured): the figures only need runs
    small.update(total_steps=600)
    small["dqn"]["learning_starts"] = 200
    small["evaluation"].update(every_env_steps=200, episodes=2, target_return=20)
    small["early_stopping"].update(eval_interval=50, eval_episodes=2)
    path = tmp_path / "tiny.yaml"
    import yaml

    path.write_text(yaml.safe_dump(small))
    rows, figures = bench_dqn(path, seeds=1, quick=False, sb3_budget=600)
    assert {r["agent"] for r in rows} == {
        "ours: DDQN+PER",
        "ours: +smoothing+early stop",
        "sb3-dqn (zoo)",
    }
    for key in (
        "ours_wall_s_to_475",
        "sb3_wall_s_to_475",
        "ratio_vs_sb3",
        "ours_steps_to_475",
        "solved_seeds",
    ):
        assert key in figures
    assert figures["ratio_vs_sb3"] > 0 and figures["target_return"] == 20
