"""`agentrl bench learning`: the JSON line's keys and sane values (`--quick`, tiny model),
held-out seeds apart from training seeds in every setting, the Sokoban shaping, the
learner reset between runs, and the statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.envs.sokoban import SokobanEnv
from agentrl.evaluation import compare as bc
from agentrl.learners.valid_action import HELDOUT_OFFSET, Learner, ValidActionConfig, env_state
from agentrl.learners.valid_action import shaped_reward as reward

CONFIG = "configs/frozenlake-valid-action.yaml"
ISSUE_KEYS = [
    "base_success",
    "trained_success",
    "seconds_to_070",
    "gigpo_final_success",
    "grpo_final_success",
    "rloo_final_success",
    "gigpo_seconds_to_050",
    "grpo_seconds_to_050",
    "gigpo_ci_low",
    "gigpo_ci_high",
    "grpo_ci_low",
    "grpo_ci_high",
    "seeds",
    "wall_s",
]


def test_quick_bench_ends_with_the_issue_keys(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    result = CliRunner().invoke(app, ["bench", "learning", "--quick", "--out", str(out)])
    assert result.exit_code == 0, result.output
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert list(last)[: len(ISSUE_KEYS)] == ISSUE_KEYS
    assert last["seeds"] == 2 and last["sokoban_seeds"] == 2
    for key in ("base_success", "trained_success", "gigpo_final_success", "grpo_final_success"):
        assert 0.0 <= last[key] <= 1.0, key
    for algo in ("gigpo", "grpo"):
        lo, hi = last[f"{algo}_ci_low"], last[f"{algo}_ci_high"]
        assert 0.0 <= lo <= last[f"{algo}_final_success"] <= hi <= 1.0
    for key in ("seconds_to_070", "gigpo_seconds_to_050", "grpo_seconds_to_050"):
        assert last[key] is None or last[key] >= 0.0
    assert last["wall_s"] > 0 and last["cpu_s"] > 0
    runs = bc.load_runs(out / "runs.jsonl")
    # per seed: the 4x4 run, then 3 curriculum and 3 Sokoban runs
    assert len(runs) == 2 * 7
    assert {(r.setting, r.algorithm) for r in runs} >= {("fl4", "gigpo"), ("sokoban", "rloo")}
    assert all(r.cpu_s > 0 and r.wall_s > 0 and r.points[0].iteration == 0 for r in runs)
    assert (out / "learning_compare.png").stat().st_size > 0
    assert "iter 2/2" in result.stderr  # a progress line per iteration without a terminal


def test_fl4_every_algorithm_compares_from_the_base(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = ["bench", "learning", "--quick", "--settings", "fl4", "--fl4-every-algorithm"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    last = json.loads(result.stdout.strip().splitlines()[-1])
    runs = bc.load_runs(out / "runs.jsonl")
    assert sorted((r.algorithm, r.seed) for r in runs) == [
        (a, s) for a in ("gigpo", "grpo", "rloo") for s in (0, 1)
    ]
    assert {r.setting for r in runs} == {"fl4"}
    assert {r.base_success for r in runs if r.seed == 0} == {runs[0].base_success}
    for algo in ("gigpo", "grpo", "rloo"):
        assert 0.0 <= last[f"fl4_{algo}_final_success"] <= 1.0
        assert last[f"fl4_{algo}_reached_050"].endswith("/2")


@pytest.mark.parametrize("plan_kind", ["full", "quick"])
def test_heldout_seeds_never_overlap_training_seeds(plan_kind: str) -> None:
    plan = (
        bc.full_plan(CONFIG, 8, "unused")
        if plan_kind == "full"
        else bc.quick_plan(CONFIG, "unused")
    )
    for setting in bc.SETTINGS:
        heldout: set[int] = set()
        trained: set[int] = set()
        for algo in bc.ALGORITHMS:
            for seed in range(plan.seeds):
                cfg = plan.config(setting, algo, seed)
                heldout |= set(cfg.heldout())
                for it in range(cfg.iterations):
                    trained |= set(cfg.train_seeds(it))
        assert heldout and trained
        assert not heldout & trained, setting
        assert max(trained) < HELDOUT_OFFSET <= min(heldout)


def test_equal_budgets_only_the_advantage_differs() -> None:
    plan = bc.full_plan(CONFIG, 5, "unused")
    for setting in ("curriculum", "sokoban"):
        cfgs = [plan.config(setting, a, 3).model_dump() for a in bc.ALGORITHMS]
        for c in cfgs:
            c.pop("algorithm")
        assert cfgs[0] == cfgs[1] == cfgs[2]


def test_sokoban_setting_is_the_shipped_sokoban_config() -> None:
    shipped = ValidActionConfig.from_file("configs/sokoban-valid-action.yaml")
    bench = bc.full_plan(CONFIG, 5, "unused").config("sokoban", "grpo", 2)
    assert bench.env_id == "sokoban" and bench.obs_format == "outcomes"
    same = ("env_kwargs", "max_steps", "iterations", "learning_rate", "system_prompt", "model")
    assert all(getattr(bench, k) == getattr(shipped, k) for k in same)
    assert bench.algorithm == "grpo" and bench.seed == 2 and not bench.save_adapter
    quick = bc.quick_plan(CONFIG, "unused").config("sokoban", "gigpo", 0)
    assert quick.model == "tiny" and quick.iterations == 2  # the quick plan's "all" wins


LEVEL = """
#######
#_____#
#_PX_O#
#_____#
#######
"""


def test_sokoban_shaping_rewards_progress_and_success() -> None:
    cfg = ValidActionConfig(env_id="sokoban", success_reward=1.0, progress_reward=0.3)
    env = SokobanEnv(layout=LEVEL, obs_format="egocentric")
    env.reset(0)
    before = env_state(env)
    _, _, _, info = env.step("right")  # box one cell closer to the target
    assert reward(cfg, env, before, info) == pytest.approx(0.3)
    before = env_state(env)
    _, _, _, info = env.step("up")  # the player moves, the box does not
    assert reward(cfg, env, before, info) == 0.0
    env.step("down")
    before = env_state(env)
    _, _, done, info = env.step("right")  # onto the target: solved
    assert done and info["success"]
    assert reward(cfg, env, before, info) == pytest.approx(1.3)


def test_sokoban_pushing_into_a_corner_gets_the_penalty() -> None:
    cfg = ValidActionConfig(env_id="sokoban", progress_reward=0.3, hole_penalty=0.5)
    env = SokobanEnv(layout="######\n#O___#\n#__XP#\n#____#\n######", obs_format="egocentric")
    env.reset(0)
    before = env_state(env)
    _, _, _, info = env.step("left")  # box (2,3) -> (2,2): closer, open floor
    assert reward(cfg, env, before, info) == pytest.approx(0.3)
    env2 = SokobanEnv(layout="######\n#O___#\n#___X#\n#___P#\n######", obs_format="egocentric")
    env2.reset(0)
    before = env_state(env2)
    _, _, _, info = env2.step("up")  # box (2,4) -> (1,4): top-right corner, off target
    assert reward(cfg, env2, before, info) == pytest.approx(0.3 - 0.5)


def test_sokoban_approach_reward_pays_walks_toward_a_loose_box() -> None:
    cfg = ValidActionConfig(env_id="sokoban", progress_reward=0.3, approach_reward=0.1)
    env = SokobanEnv(layout="#######\n#P____#\n#___X_#\n#____O#\n#######")
    env.reset(0)
    before = env_state(env)
    _, _, _, info = env.step("right")  # distance to the box 4 -> 3
    assert reward(cfg, env, before, info) == pytest.approx(0.1)
    before = env_state(env)
    _, _, _, info = env.step("left")  # back: 3 -> 4
    assert reward(cfg, env, before, info) == pytest.approx(-0.1)
    off = ValidActionConfig(env_id="sokoban", progress_reward=0.3)  # the default: 0
    before = env_state(env)
    _, _, _, info = env.step("down")
    assert reward(off, env, before, info) == 0.0


def _tiny_plan() -> bc.Plan:
    return bc.quick_plan(CONFIG, "unused")


def test_reset_gives_the_base_model_or_the_warm_start_exactly() -> None:
    torch.set_num_threads(1)
    plan = _tiny_plan()
    cfg = plan.config("fl4", "gigpo", 0)
    learner = Learner(cfg)
    texts = [learner.cache.prompt("You are at row 0, column 0. Your move?")]
    with torch.no_grad():
        base = learner.scorer.logprobs(texts).clone()
        for p in learner.params:
            p.add_(0.05 * torch.randn_like(p))
        moved = learner.scorer.logprobs(texts).clone()
        warm = bc.lora_state(learner)
    assert not torch.allclose(base, moved)
    bc.reset_learner(learner, plan.config("curriculum", "grpo", 1), None)
    with torch.no_grad():
        assert torch.allclose(learner.scorer.logprobs(texts), base, atol=1e-6)
    bc.reset_learner(learner, plan.config("curriculum", "grpo", 1), warm)
    with torch.no_grad():
        assert torch.allclose(learner.scorer.logprobs(texts), moved, atol=1e-6)
    assert learner.config.algorithm == "grpo" and learner.config.seed == 1


def _run(algo: str, seed: int, curve: list[tuple[int, float, float]]) -> bc.Run:
    pts = [bc.Point(i, w, 2 * w, s) for i, w, s in curve]
    return bc.Run(
        "curriculum",
        algo,
        seed,
        50,
        curve[0][2],
        curve[-1][2],
        round(curve[-1][2] * 50),
        pts,
        curve[-1][1],
        2 * curve[-1][1],
        1.0,
        100,
        1.0,
        1.0,
        1,
    )


def test_summary_statistics() -> None:
    runs = [
        _run("gigpo", 0, [(0, 0.0, 0.3), (2, 10.0, 0.5), (4, 20.0, 0.8)]),
        _run("gigpo", 1, [(0, 0.0, 0.3), (2, 12.0, 0.6), (4, 24.0, 0.7)]),
        _run("gigpo", 2, [(0, 0.0, 0.3), (2, 11.0, 0.4), (4, 22.0, 0.6)]),
    ]
    s = bc.summarise(runs, "curriculum", "gigpo")
    assert s["n"] == 3 and s["final"] == pytest.approx(0.7)
    lo, hi = s["ci"]
    assert lo < 0.7 < hi  # t(2) = 4.303, sd 0.1: half-width 0.248
    assert hi - lo == pytest.approx(2 * 4.303 * 0.1 / 3**0.5, abs=1e-3)
    w_lo, w_hi = s["wilson"]  # 105 of 150 pooled
    assert w_lo < 0.7 < w_hi and w_hi - w_lo < hi - lo
    assert s["t050"] == 12.0 and s["t050_reached"] == "3/3"  # median of 10, 12, 22
    assert s["t050_cpu"] == 24.0
    assert s["t070"] == 22.0 and s["t070_reached"] == "2/3"
    assert bc.median_reached([1.0, None, None]) is None
    line = bc.last_line(
        runs, {"wall_s": 1.0, "cpu_s": 2.0, "load_start": 1.0, "load_end": 1.0}, _tiny_plan(), 1
    )
    assert list(line)[: len(ISSUE_KEYS)] == ISSUE_KEYS
    assert line["gigpo_final_success"] == 0.7 and line["grpo_final_success"] is None
