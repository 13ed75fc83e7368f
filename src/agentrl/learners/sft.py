"""`agentrl train-sft`: a supervised warm start of the free-form policy on BFS demonstrations.

Free-form generation (the path Agent Zero JSON calls need) starts from a base that answers a
FrozenLake board with prose, so RL sees almost only invalid steps. This job teaches the
answer format and a good move first: the BFS expert (`envs.frozenlake.shortest_path`) walks
each training map inside the real rollout worker, so every demonstration's prompt is token
for token the prompt the free-form policy sees; the loss is the negative log-likelihood of
the expert's move (and EOS) under the chat template. Before and after, the same held-out
maps are played greedily with `HFAgentPolicy` to measure success and the invalid-action
rate. The result is a checkpoint in the `agentrl.llm.checkpoint` format, so `agentrl
train-policy --model <checkpoint>` can continue with RL from it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.learners.onpolicy import EVAL_SEED_OFFSET, LoopSettings, collect, make_tasks
from agentrl.llm.config import TrainerConfig
from agentrl.llm.forward import run_head
from agentrl.llm.samples import PolicySample, encode_action, make_microbatches, sample_from_step
from agentrl.llm.trainer import PolicyTrainer

log = logging.getLogger(__name__)

SHORT_PROMPT = (
    "You walk on a frozen lake from the start to the goal; a hole ends the game. "
    "Answer with exactly one word: up, down, left or right."
)


@dataclass
class SFTSettings:
    """What the warm start trains on and how it is measured (train and held-out seeds never
    overlap: held-out maps start at `EVAL_SEED_OFFSET`)."""

    env_id: str = "frozenlake-4x4"
    obs_format: str = "egocentric"
    train_maps: int = 24
    heldout_maps: int = 50
    max_steps: int = 8
    epochs: int = 2
    batch_size: int = 16
    max_new_tokens: int = 6
    history_window: int = 0
    system_prompt: str | None = SHORT_PROMPT
    seed: int = 0
    out_dir: Path = Path("runs/sft")
    write_files: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def loop(self) -> LoopSettings:
        return LoopSettings(
            env_id=self.env_id,
            max_steps=self.max_steps,
            max_new_tokens=self.max_new_tokens,
            system_prompt=self.system_prompt,
            env_kwargs={"obs_format": self.obs_format},
            base_seed=self.seed,
            write_files=False,
        )


class BFSExpertPolicy:
    """Plays one FrozenLake map's shortest path (non-slippery) through the worker's policy
    protocol, recording the exact prompt ids the free-form policy would have been given."""

    def __init__(self, moves: Sequence[str], encode: Any, tokenizer: Any) -> None:
        self.moves = list(moves)
        self.encode = encode
        self.tokenizer = tokenizer
        self.step = 0

    async def get_action(
        self, observation: Any, available_tools_specs: list[dict[str, Any]] | None = None
    ) -> tuple[dict[str, Any], str, dict[str, Any], None]:
        from agentrl.rollout.parsing import parse_policy_output

        move = self.moves[min(self.step, len(self.moves) - 1)]
        self.step += 1
        log = {
            "prompt_ids": self.encode(observation, available_tools_specs),
            "tokens": encode_action(self.tokenizer, move),
        }
        return parse_policy_output(move), move, log, None


def collect_demonstrations(
    settings: SFTSettings, model: Any, tokenizer: Any, seeds: Sequence[int]
) -> list[PolicySample]:
    """One sample per expert step on each map (one episode per map: the expert is
    deterministic), via the real rollout worker and environment."""
    from agentrl.envs import make_env
    from agentrl.envs.frozenlake import shortest_path
    from agentrl.rollout.policies.hf_policy import HFAgentPolicy

    if not settings.env_id.startswith("frozenlake") or "slippery" in settings.env_id:
        raise ValueError(f"BFS demonstrations need non-slippery FrozenLake, not {settings.env_id}")
    encoder = HFAgentPolicy(model, tokenizer)  # only its chat-template encoding is used
    loop = settings.loop()
    samples: list[PolicySample] = []
    for seed, task in zip(seeds, make_tasks(loop, seeds), strict=True):
        env: Any = make_env(settings.env_id, **loop.env_kwargs)
        env.reset(int(seed))
        moves = shortest_path(env.desc)
        if not moves:
            continue
        expert = BFSExpertPolicy(moves, encoder.encode, tokenizer)
        episode = asyncio.run(collect([task], 1, expert, settings.history_window))[0][0]
        for step in episode.steps:
            samples.append(sample_from_step(step, tokenizer, advantage=1.0))
    return samples


def sft_epoch(trainer: PolicyTrainer, samples: Sequence[PolicySample], batch_size: int) -> float:
    """One shuffled pass of NLL over the action tokens; returns the mean loss."""
    order = torch.randperm(len(samples), generator=trainer.generator).tolist()
    losses: list[float] = []
    for start in range(0, len(order), batch_size):
        batch = [samples[i] for i in order[start : start + batch_size]]
        mbs = make_microbatches(batch, trainer.config.micro_batch_tokens, trainer.pad_id)
        n_tokens = sum(mb.num_action_tokens for mb in mbs)
        trainer.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for mb in mbs:
            with trainer._autocast():
                logp = run_head(trainer.module, mb, trainer.device)["logp"]
            loss = -logp.sum() / n_tokens
            loss.backward()
            total += float(loss.detach())
        trainer._optimizer_step()
        losses.append(total)
    return float(np.mean(losses)) if losses else math.nan


@torch.no_grad()
def mean_action_logprob(trainer: PolicyTrainer, samples: Sequence[PolicySample]) -> float:
    """Mean log-prob per action token of `samples` under the current model (the likelihood
    the warm start raises)."""
    was = trainer.head.training
    trainer.head.eval()
    try:
        mbs = make_microbatches(samples, trainer.config.micro_batch_tokens, trainer.pad_id)
        parts = [run_head(trainer.head, mb, trainer.device)["logp"] for mb in mbs]
    finally:
        trainer.head.train(was)
    return float(torch.cat(parts).mean())


@dataclass
class FreeformStats:
    episodes: int
    success: float
    invalid_action_rate: float
    mean_steps: float


def evaluate_freeform(
    trainer: PolicyTrainer, settings: SFTSettings, seeds: Sequence[int]
) -> FreeformStats:
    """Greedy free-form episodes on `seeds`: success and the share of invalid steps."""
    from agentrl.rollout.policies.hf_policy import HFAgentPolicy

    policy = HFAgentPolicy(
        trainer.policy.model,
        trainer.policy.tokenizer,
        max_new_tokens=settings.max_new_tokens,
        temperature=0.0,
        max_batch_size=len(seeds),
    )
    loop = settings.loop()
    was = trainer.head.training
    trainer.head.eval()
    try:
        groups = asyncio.run(collect(make_tasks(loop, seeds), 1, policy, settings.history_window))
    finally:
        trainer.head.train(was)
    eps = [g[0] for g in groups]
    steps = sum(len(ep.steps) for ep in eps)
    invalid = sum(bool(s.step_info.get("invalid_action")) for ep in eps for s in ep.steps)
    return FreeformStats(
        episodes=len(eps),
        success=float(np.mean([ep.success for ep in eps])),
        invalid_action_rate=invalid / max(1, steps),
        mean_steps=steps / max(1, len(eps)),
    )


def heldout_seeds(settings: SFTSettings) -> list[int]:
    return [EVAL_SEED_OFFSET + settings.seed + i for i in range(settings.heldout_maps)]


def train_seeds(settings: SFTSettings) -> list[int]:
    return [settings.seed * 100_000 + i for i in range(settings.train_maps)]


def run_sft_job(
    config: TrainerConfig, settings: SFTSettings, trainer: PolicyTrainer | None = None
) -> dict[str, Any]:
    """Measure, warm-start on demonstrations, measure again, save the adapter."""
    t0 = time.perf_counter()
    trainer = trainer or PolicyTrainer.from_config(config)
    held = heldout_seeds(settings)
    train = train_seeds(settings)
    assert not set(held) & set(train), "held-out maps overlap training maps"
    before = evaluate_freeform(trainer, settings, held)
    t1 = time.perf_counter()
    log.info("before: %s (%.0f s)", before, t1 - t0)
    demos = collect_demonstrations(settings, trainer.policy.model, trainer.policy.tokenizer, train)
    lp_before = mean_action_logprob(trainer, demos)
    log.info("%d demonstration steps, log-prob/token %.3f", len(demos), lp_before)
    losses = []
    for epoch in range(settings.epochs):
        losses.append(sft_epoch(trainer, demos, settings.batch_size))
        log.info("epoch %d: loss %.4f (%.0f s)", epoch + 1, losses[-1], time.perf_counter() - t1)
    lp_after = mean_action_logprob(trainer, demos)
    t2 = time.perf_counter()
    after = evaluate_freeform(trainer, settings, held)
    t3 = time.perf_counter()
    checkpoint = None
    if settings.write_files:
        from agentrl.llm.checkpoint import CheckpointManager

        ckpt = CheckpointManager(
            config.storage_path,
            config.max_checkpoints,
            config.storage_options,
            run_info={
                "name": f"agentrl SFT warm start on {settings.env_id}",
                "data": f"BFS demonstrations on {settings.train_maps} {settings.env_id} maps "
                f"({settings.obs_format} observations)",
            },
        )
        checkpoint = ckpt.save(trainer, {"sft_losses": losses}, name="final")
    return {
        "model": config.model,
        "env": settings.env_id,
        "obs_format": settings.obs_format,
        "demonstrations": len(demos),
        "train_maps": len(train),
        "heldout_seeds": len(held),
        "epochs": settings.epochs,
        "optimizer_steps": trainer.global_step,
        "losses": losses,
        "demo_logprob_before": lp_before,
        "demo_logprob_after": lp_after,
        "before": asdict(before),
        "after": asdict(after),
        "final_checkpoint": checkpoint,
        "eval_s": (t1 - t0) + (t3 - t2),
        "train_s": t2 - t1,
        "wall_s": t3 - t0,
    }
