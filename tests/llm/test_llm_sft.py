"""The SFT warm start on BFS demonstrations, on a real tiny random transformer (seconds)."""

from __future__ import annotations

import json
import re

from agentrl.envs import make_env
from agentrl.envs.frozenlake import shortest_path
from agentrl.learners.sft import (
    SFTSettings,
    collect_demonstrations,
    heldout_seeds,
    mean_action_logprob,
    run_sft_job,
    sft_epoch,
    train_seeds,
)
from agentrl.llm.config import TrainerConfig
from agentrl.llm.loading import load_policy
from agentrl.llm.trainer import PolicyTrainer

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}


def make_trainer(lr: float = 3e-3) -> PolicyTrainer:
    cfg = TrainerConfig(model="tiny", lora_r=0, learning_rate=lr, batch_size=8)
    return PolicyTrainer(load_policy("tiny", seed=cfg.seed, tiny_kwargs=TINY), cfg)


def test_demonstrations_are_the_bfs_moves_in_the_policys_own_prompts() -> None:
    trainer = make_trainer()
    tok = trainer.policy.tokenizer
    settings = SFTSettings(train_maps=3)
    seeds = train_seeds(settings)
    demos = collect_demonstrations(settings, trainer.policy.model, tok, seeds)
    expected = []
    for seed in seeds:
        env = make_env("frozenlake-4x4", obs_format="egocentric")
        env.reset(seed)
        expected += shortest_path(env.desc) or []
    assert [tok.decode(d.action_ids, skip_special_tokens=True) for d in demos] == expected
    first = tok.decode(demos[0].prompt_ids)
    assert "You are at row 0, column 0." in first and "exactly one word" in first
    assert demos[0].action_ids[-1] == tok.eos_token_id  # it also learns to stop


def test_sft_raises_the_demonstrated_actions_likelihood() -> None:
    trainer = make_trainer()
    settings = SFTSettings(train_maps=4)
    demos = collect_demonstrations(
        settings, trainer.policy.model, trainer.policy.tokenizer, train_seeds(settings)
    )
    before = mean_action_logprob(trainer, demos)
    losses = [sft_epoch(trainer, demos, batch_size=8) for _ in range(4)]
    after = mean_action_logprob(trainer, demos)
    assert after > before + 1.0, (before, after, losses)
    assert losses[-1] < losses[0]


def test_job_measures_before_and_after_on_disjoint_seeds_and_saves(tmp_path) -> None:
    settings = SFTSettings(
        train_maps=3, heldout_maps=2, epochs=1, max_steps=3, max_new_tokens=3, out_dir=tmp_path
    )
    assert not set(heldout_seeds(settings)) & set(train_seeds(settings))
    cfg = TrainerConfig(
        model="tiny", lora_r=0, learning_rate=1e-3, storage_path=str(tmp_path / "ckpt")
    )
    trainer = PolicyTrainer(load_policy("tiny", seed=0, tiny_kwargs=TINY), cfg)
    out = run_sft_job(cfg, settings, trainer=trainer)
    assert out["heldout_seeds"] == 2 and out["before"]["episodes"] == 2
    assert 0.0 <= out["after"]["invalid_action_rate"] <= 1.0
    assert out["demo_logprob_after"] > out["demo_logprob_before"]
    manifest = json.loads((tmp_path / "ckpt" / "final" / "manifest.json").read_text())
    assert manifest and re.search("final", out["final_checkpoint"])


def test_train_sft_command_prints_the_table_and_a_last_json_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.llm.checkpoint import verify_local

    args = ["train-sft", "--model", "tiny", "--train-maps", "2", "--heldout-maps", "2"]
    args += ["--epochs", "1", "--max-steps", "2", "--lora-r", "0", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "invalid-action rate" in result.stdout
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["heldout_seeds"] == 2 and set(last["before"]) == set(last["after"])
    verify_local(tmp_path / "checkpoints" / "final")
