"""Rollout episodes -> samples with each algorithm's advantages, and the train-policy loop
end to end on the real FrozenLake environment with a tiny model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentrl.learners.onpolicy import (
    LoopSettings,
    build_pairs,
    build_samples,
    collect,
    make_tasks,
    run_training,
)
from agentrl.llm.config import TrainerConfig
from agentrl.llm.loading import LoraSettings, load_policy
from agentrl.llm.trainer import PolicyTrainer
from agentrl.rollout.policies import ScriptedPolicy

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1}
MAP = ["SF", "FG"]  # 2x2 lake: right, down reaches the goal; up, up goes nowhere


def trainer_for(algorithm: str) -> PolicyTrainer:
    cfg = TrainerConfig(
        model="tiny",
        algorithm=algorithm,
        lora_r=0,
        learning_rate=1e-3,
        batch_size=8,
        gamma=0.95,
        history_window=2,
    )
    return PolicyTrainer(load_policy("tiny", tiny_kwargs=TINY), cfg)


def groups():
    loop = LoopSettings(env_id="frozenlake-4x4", max_steps=2, env_kwargs={"desc": MAP})
    tasks = make_tasks(loop, [0])
    policy = ScriptedPolicy(per_episode=[["right", "down"], ["up", "up"]] * 2)
    return asyncio.run(collect(tasks, 4, policy, history_window=2))


@pytest.mark.parametrize("algorithm", ["gigpo", "grpo", "rloo"])
def test_group_advantages_favour_the_successful_episodes(algorithm: str) -> None:
    g = groups()
    trainer = trainer_for(algorithm)
    samples = build_samples(g, trainer)
    assert len(samples) == 8  # 4 episodes x 2 steps, re-rendered (no rollout tokens)
    by_episode: dict[str, list[float]] = {}
    for s in samples:
        by_episode.setdefault(s.episode_id, []).append(s.advantage)
    won = {ep.episode_id for ep in g[0] if ep.success}
    assert len(won) == 2
    for eid, advs in by_episode.items():
        assert all((a > 0) == (eid in won) for a in advs), (algorithm, eid, advs)
    history = trainer.train_on_samples(samples)  # old log-probs recomputed
    assert history and all(s.old_logprobs is not None for s in samples)


def test_ppo_uses_gae_with_the_value_head() -> None:
    trainer = trainer_for("ppo")
    samples = build_samples(groups(), trainer)
    assert all(s.ret is not None and s.old_value is not None for s in samples)
    advs = [s.advantage for s in samples]
    assert abs(sum(advs) / len(advs)) < 1e-6  # normalised
    assert trainer.train_on_samples(samples)


def test_dpo_pairs_best_against_worst_and_skip_ties() -> None:
    g = groups()
    trainer = trainer_for("dpo")
    pairs = build_pairs(g, trainer)
    assert len(pairs) == 1 and pairs[0].margin == pytest.approx(1.0)
    tied = [[ep for ep in g[0] if not ep.success]]
    assert build_pairs(tied, trainer) == []
    assert trainer.train_on_pairs(pairs)


def test_train_policy_loop_writes_curve_metrics_and_checkpoints(tmp_path: Path) -> None:
    cfg = TrainerConfig(
        model="tiny",
        algorithm="grpo",
        lora_r=4,
        learning_rate=1e-3,
        batch_size=8,
        storage_path=str(tmp_path / "ckpt"),
        save_interval=1,
        lora_target_modules=["q_proj", "v_proj"],
    )
    loop = LoopSettings(
        env_id="frozenlake-4x4",
        iterations=2,
        tasks_per_iteration=1,
        group_size=2,
        max_steps=2,
        max_new_tokens=3,
        eval_episodes=1,
        out_dir=tmp_path / "run",
    )
    seen = []
    lora = LoraSettings(r=4, target_modules=("q_proj", "v_proj"))
    trainer = PolicyTrainer(load_policy("tiny", tiny_kwargs=TINY, lora=lora), cfg)
    result = run_training(cfg, loop, on_iteration=seen.append, trainer=trainer)
    assert [r.iteration for r in seen] == [1, 2] and all(r.episodes == 2 for r in seen)
    assert Path(result.curve_png or "").exists()
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert len(metrics["iterations"]) == 2
    assert (tmp_path / "ckpt" / "final" / "adapter_model.safetensors").exists()
    assert (tmp_path / "ckpt" / "best" / "model_card.md").exists()
