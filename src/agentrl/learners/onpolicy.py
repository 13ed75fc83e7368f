"""`agentrl train-policy`: rollouts with the current model, advantages, update, repeat.

One iteration: sample `tasks_per_iteration` task seeds, run `group_size` episodes of each
with `HFAgentPolicy` over the model being trained (batched generation, exact token ids and
log-probs recorded), turn episodes into samples with the algorithm's advantages, and run
the trainer on them. Optionally a greedy evaluation on fixed holdout seeds keeps `best/`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.core.episodes import Message, TaskDefinition
from agentrl.llm.config import TrainerConfig
from agentrl.llm.samples import PolicySample, sample_from_step
from agentrl.llm.trainer import PolicyTrainer, PreferencePair
from agentrl.rollout.worker import Episode, run_group

log = logging.getLogger(__name__)

EVAL_SEED_OFFSET = 1_000_000  # holdout task seeds never used for training


@dataclass
class LoopSettings:
    env_id: str = "frozenlake-4x4"
    iterations: int = 10
    tasks_per_iteration: int = 4
    group_size: int = 4
    max_steps: int = 8
    max_new_tokens: int = 24
    eval_episodes: int = 8
    resume: bool = False
    out_dir: Path = Path("runs/train-policy")
    base_seed: int = 0
    system_prompt: str | None = None  # replaces the environment's (shorter prompts = faster)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    write_files: bool = True


@dataclass
class IterationRecord:
    iteration: int
    episodes: int
    success_rate: float
    reward_mean: float
    reward_std: float
    mean_steps: float
    invalid_action_rate: float
    samples: int
    optimizer_steps: int
    loss: float | None
    policy_entropy: float | None
    approx_kl: float | None
    rollout_s: float
    update_s: float
    eval_success: float | None = None


@dataclass
class TrainingResult:
    config: TrainerConfig
    loop: LoopSettings
    records: list[IterationRecord]
    final_checkpoint: str | None = None
    best_checkpoint: str | None = None
    curve_png: str | None = None
    initial_eval_success: float | None = None

    def summary(self) -> dict[str, Any]:
        last = self.records[-1] if self.records else None
        return {
            "algorithm": self.config.algorithm,
            "env": self.loop.env_id,
            "iterations": len(self.records),
            "success_per_iteration": [r.success_rate for r in self.records],
            "final_success": last.success_rate if last else None,
            "initial_eval_success": self.initial_eval_success,
            "final_eval_success": last.eval_success if last else None,
            "final_checkpoint": self.final_checkpoint,
            "best_checkpoint": self.best_checkpoint,
            "curve_png": self.curve_png,
        }


def make_tasks(loop: LoopSettings, seeds: Sequence[int]) -> list[TaskDefinition]:
    from agentrl.envs import task_for

    tasks = []
    for s in seeds:
        task = task_for(loop.env_id, int(s), max_episode_steps=loop.max_steps, **loop.env_kwargs)
        if loop.system_prompt is not None:
            task.initial_messages = [Message(role="system", content=loop.system_prompt)]
            task.tool_specs = []
        tasks.append(task)
    return tasks


async def collect(
    tasks: Sequence[TaskDefinition], group_size: int, policy: Any, history_window: int | None
) -> list[list[Episode]]:
    """Run every task's group concurrently (the policy batches their generate calls)."""
    groups = await asyncio.gather(
        *(
            run_group(task, group_size, policy, history_window=history_window, env_in_thread=False)
            for task in tasks
        )
    )
    return list(groups)


def episode_score(ep: Episode, scores: Mapping[str, float] | None = None) -> float:
    if scores is not None and ep.episode_id in scores:
        return float(scores[ep.episode_id])
    return ep.total_reward


def build_samples(
    groups: Sequence[Sequence[Episode]],
    trainer: PolicyTrainer,
    scores: Mapping[str, float] | None = None,
) -> list[PolicySample]:
    """Episodes -> samples with the algorithm's advantages (GiGPO, GRPO, RLOO or GAE).

    `scores` maps episode ids to their episode score (e.g. the reward service's total
    reward); without it an episode scores its summed environment reward.
    """
    from agentrl.advantages import (
        gae,
        grpo_advantages,
        rloo_advantages,
        system_apply_gigpo_to_batch_steps,
    )

    cfg = trainer.config
    episodes = [ep for g in groups for ep in g if ep.steps]
    if not episodes:
        return []
    ep_scores = [episode_score(ep, scores) for ep in episodes]
    gids = [ep.group_id for ep in episodes]
    if cfg.algorithm == "gigpo":
        system_apply_gigpo_to_batch_steps(
            [ep.steps for ep in episodes],
            ep_scores,
            omega=cfg.gigpo_omega,
            gamma=cfg.gamma,
            group_ids=gids,
            combine="additive",  # A_E + omega * A_S, as in the GiGPO paper (omega = 1)
            final_score_at_last_step=False,  # base_reward already holds the env's rewards
        )
        per_episode: list[float] | None = None
    elif cfg.algorithm in ("grpo", "rloo"):
        fn = grpo_advantages if cfg.algorithm == "grpo" else rloo_advantages
        per_episode = [float(a) for a in fn(ep_scores, gids)]
    else:
        per_episode = None
    samples: list[PolicySample] = []
    owners: list[int] = []
    for i, ep in enumerate(episodes):
        for step in ep.steps:
            adv = per_episode[i] if per_episode is not None else None
            try:
                s = sample_from_step(
                    step,
                    trainer.policy.tokenizer,
                    advantage=adv,
                    history_window=cfg.history_window,
                    reward=ep_scores[i],
                    group_id=ep.group_id,
                    episode_id=ep.episode_id,
                )
            except ValueError:  # a step without tokens (the policy failed): nothing to learn
                continue
            s.meta["base_reward"] = float(step.base_reward or 0.0)
            s.meta["done"] = bool(step.is_done)
            samples.append(s)
            owners.append(i)
    if cfg.algorithm == "ppo" and samples:
        trainer.score(samples)  # V(s) from the value head, old log-probs if missing
        rewards = np.array([s.meta["base_reward"] for s in samples])
        values = np.array([s.old_value or 0.0 for s in samples])
        # Episode ends split the time axis; consecutive samples of one episode are in order.
        ends = np.array(
            [
                s.meta["done"] or k + 1 == len(samples) or owners[k + 1] != owners[k]
                for k, s in enumerate(samples)
            ]
        )
        gae_adv, gae_ret = gae(rewards, values, ends, gamma=cfg.gamma, lam=cfg.gae_lambda)
        normed = (gae_adv - gae_adv.mean()) / (gae_adv.std() + 1e-8)
        for s, a, r in zip(samples, normed.tolist(), gae_ret.tolist(), strict=True):
            s.advantage, s.ret = a, r
    return samples


def build_pairs(
    groups: Sequence[Sequence[Episode]],
    trainer: PolicyTrainer,
    scores: Mapping[str, float] | None = None,
) -> list[PreferencePair]:
    """DPO pairs: best vs worst episode of each group; tied groups are skipped."""
    pairs = []
    tok = trainer.policy.tokenizer
    window = trainer.config.history_window
    for g in groups:
        eps = [ep for ep in g if ep.steps]
        if len(eps) < 2:
            continue
        ranked = sorted(eps, key=lambda ep: episode_score(ep, scores))
        worst, best = ranked[0], ranked[-1]
        margin = episode_score(best, scores) - episode_score(worst, scores)
        if margin <= 0:
            continue
        try:
            chosen = [sample_from_step(s, tok, history_window=window) for s in best.steps]
            rejected = [sample_from_step(s, tok, history_window=window) for s in worst.steps]
        except ValueError:
            continue
        pairs.append(PreferencePair(chosen, rejected, margin))
    return pairs


def evaluate(trainer: PolicyTrainer, loop: LoopSettings, n: int, max_new_tokens: int) -> float:
    """Greedy success rate on `n` fixed holdout task seeds."""
    from agentrl.rollout.policies.hf_policy import HFAgentPolicy

    if n <= 0:
        return float("nan")
    policy = HFAgentPolicy(
        trainer.policy.model,
        trainer.policy.tokenizer,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        max_batch_size=n,
    )
    tasks = make_tasks(loop, [EVAL_SEED_OFFSET + loop.base_seed + i for i in range(n)])
    groups = asyncio.run(collect(tasks, 1, policy, trainer.config.history_window))
    eps = [g[0] for g in groups]
    return float(np.mean([ep.success for ep in eps]))


def run_training(
    config: TrainerConfig,
    loop: LoopSettings,
    *,
    show_progress: bool = False,
    on_iteration: Callable[[IterationRecord], None] | None = None,
    trainer: PolicyTrainer | None = None,
) -> TrainingResult:
    """The whole train-policy run; see the module docstring."""
    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.rollout.policies.hf_policy import HFAgentPolicy

    trainer = trainer or PolicyTrainer.from_config(config)
    ckpt = None
    if loop.write_files:
        ckpt = CheckpointManager(
            config.storage_path,
            config.max_checkpoints,
            config.storage_options,
            run_info={
                "name": f"agentrl {config.algorithm} on {loop.env_id}",
                "data": f"on-policy rollouts of {loop.env_id}, {loop.tasks_per_iteration} task "
                f"seeds x {loop.group_size} episodes per iteration",
            },
        )
        if loop.resume and ckpt.resume(trainer):
            log.info("resumed at optimiser step %d", trainer.global_step)
    batch = loop.tasks_per_iteration * loop.group_size
    policy = HFAgentPolicy(
        trainer.policy.model,
        trainer.policy.tokenizer,
        max_new_tokens=loop.max_new_tokens,
        temperature=config.temperature,
        max_batch_size=batch,
        max_wait_ms=20.0,
        seed=config.seed,
    )
    rank, world = trainer.dist.rank, trainer.dist.world_size
    result = TrainingResult(config=config, loop=loop, records=[])
    if loop.eval_episodes and trainer.dist.is_main:
        result.initial_eval_success = evaluate(
            trainer, loop, loop.eval_episodes, loop.max_new_tokens
        )
    progress = _progress(show_progress and trainer.dist.is_main, loop.iterations)
    last_saved = trainer.global_step
    with progress as bar:
        task_id = bar.add_task(f"{config.algorithm} on {loop.env_id}", total=loop.iterations)
        for it in range(loop.iterations):
            t0 = time.perf_counter()
            # Under DDP every rank rolls out its own task seeds, then all share the samples.
            per_iter = loop.tasks_per_iteration * world
            seeds = [
                loop.base_seed + it * per_iter + rank * loop.tasks_per_iteration + k
                for k in range(loop.tasks_per_iteration)
            ]
            groups = asyncio.run(
                collect(make_tasks(loop, seeds), loop.group_size, policy, config.history_window)
            )
            t1 = time.perf_counter()
            episodes = [ep for g in groups for ep in g]
            outcomes = _gather(
                trainer,
                [
                    (
                        episode_score(ep),
                        ep.success,
                        len(ep.steps),
                        sum(bool(s.step_info.get("invalid_action")) for s in ep.steps),
                    )
                    for ep in episodes
                ],
            )
            scores = np.array([o[0] for o in outcomes])
            success = float(np.mean([o[1] for o in outcomes]))
            if config.algorithm == "dpo":
                pairs = _gather(trainer, build_pairs(groups, trainer))
                history = trainer.train_on_pairs(pairs) if pairs else []
                n_samples = len(pairs)
            else:
                samples = _gather(trainer, build_samples(groups, trainer))
                for s in samples:
                    s.reward = float(scores.mean())  # metrics: the batch's reward
                history = trainer.train_on_samples(samples, allow_empty=True)
                n_samples = len(samples)
            t2 = time.perf_counter()
            rec = IterationRecord(
                iteration=it + 1,
                episodes=len(outcomes),
                success_rate=success,
                reward_mean=float(scores.mean()),
                reward_std=float(scores.std()),
                mean_steps=float(np.mean([o[2] for o in outcomes])),
                invalid_action_rate=float(
                    sum(o[3] for o in outcomes) / max(1, sum(o[2] for o in outcomes))
                ),
                samples=n_samples,
                optimizer_steps=len(history),
                loss=_mean(history, "loss"),
                policy_entropy=_mean(history, "policy_entropy"),
                approx_kl=_mean(history, "approx_kl"),
                rollout_s=t1 - t0,
                update_s=t2 - t1,
            )
            if loop.eval_episodes and ckpt is not None and trainer.dist.is_main:
                rec.eval_success = evaluate(trainer, loop, loop.eval_episodes, loop.max_new_tokens)
                ckpt.save_best(trainer, rec.eval_success, asdict(rec))
            if ckpt is not None and trainer.global_step - last_saved >= config.save_interval:
                ckpt.save(trainer, asdict(rec))
                last_saved = trainer.global_step
            result.records.append(rec)
            if on_iteration:
                on_iteration(rec)
            if trainer.dist.is_main:
                bar.console.print(_line(rec)) if show_progress else log.info(_line(rec))
            bar.advance(task_id)
    if ckpt is not None:
        last = asdict(result.records[-1]) if result.records else {}
        result.final_checkpoint = ckpt.save(trainer, last, name="final")
        if ckpt.best_score is not None:
            result.best_checkpoint = ckpt.url("best")
    if loop.write_files and trainer.dist.is_main:
        result.curve_png = str(write_outputs(result, loop.out_dir))
    trainer.dist.barrier()
    return result


def _gather(trainer: PolicyTrainer, items: list[Any]) -> list[Any]:
    """Every rank's items, concatenated in rank order (all ranks get the same list)."""
    if not trainer.dist.enabled:
        return items
    return [x for part in trainer.dist.all_gather_objects(items) for x in part]


def _mean(history: list[dict[str, float]], key: str) -> float | None:
    vals = [h[key] for h in history if key in h]
    return float(np.mean(vals)) if vals else None


def _line(rec: IterationRecord) -> str:
    ev = "" if rec.eval_success is None else f"  eval {rec.eval_success:.2f}"
    loss = "-" if rec.loss is None else f"{rec.loss:+.4f}"
    return (
        f"iter {rec.iteration:3d}  success {rec.success_rate:.2f}  reward {rec.reward_mean:+.3f}"
        f"  steps {rec.mean_steps:.1f}  invalid {rec.invalid_action_rate:.2f}"
        f"  samples {rec.samples}  loss {loss}{ev}"
        f"  ({rec.rollout_s:.0f}s rollout, {rec.update_s:.0f}s update)"
    )


class _NullProgress:
    console = type("C", (), {"print": staticmethod(lambda *a, **k: None)})()

    def __enter__(self) -> _NullProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *a: Any, **k: Any) -> int:
        return 0

    def advance(self, *a: Any, **k: Any) -> None:
        return None


def _progress(show: bool, total: int) -> Any:
    if not show:
        return _NullProgress()
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )


def write_outputs(result: TrainingResult, out_dir: Path) -> Path:
    """metrics.json and a PNG learning curve (success and eval success per iteration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(
        json.dumps(
            {"summary": result.summary(), "iterations": [asdict(r) for r in result.records]},
            indent=2,
            default=float,
        )
    )
    fig, ax = plt.subplots(figsize=(6, 3.5))
    its = [r.iteration for r in result.records]
    ax.plot(its, [r.success_rate for r in result.records], marker="o", label="rollout success")
    evals = [r.eval_success for r in result.records]
    if any(e is not None for e in evals):
        ax.plot(its, [np.nan if e is None else e for e in evals], marker="s", label="greedy eval")
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{result.config.algorithm} on {result.loop.env_id}")
    ax.legend()
    fig.tight_layout()
    path = out_dir / "learning_curve.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
