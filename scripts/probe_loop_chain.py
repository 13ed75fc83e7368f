"""The main job's training chain without the stack: is its late jump the loop's or the chain's?

`agentrl loop` continues one version per job: 256 episodes acted at temperature 6 by the
version before, then `training.choice_job.train_choices` (AWR, 20 epochs x 4 minibatches,
lr 2e-3, a fresh optimiser per job, GiGPO step returns discounted at 0.5, the policy
softmax(z / 2) over the moves). This runs the
same chain in one process (16 maps x 16 episodes per job, the job's own training function)
and prints greedy success on the 50 held-out maps after every job, as JSON lines:

    .venv/bin/python scripts/probe_loop_chain.py --seed 1
    .venv/bin/python scripts/probe_loop_chain.py --epochs 40 --window 2
    .venv/bin/python scripts/probe_loop_chain.py --lag 2 --acting-temperature 3 --gamma 0.99

About 30 s a job on one quiet AVX2 core (2026-11-27); results in docs/bench/2026-11.md,
"Why the chain jumped late" (s7, s8).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from agentrl.learners.valid_action import (
    SYSTEM_PROMPT,
    Batch,
    Learner,
    PromptCache,
    ValidActionConfig,
    advantages,
    evaluate_heldout,
    rollout,
)
from agentrl.training.choice_job import AWR_MAX_WEIGHT, train_choices


def merged(batches: list[Batch], maps: int) -> Batch:
    """One batch of several: episode and group numbers made distinct."""
    steps, ret, succ, groups, length = [], [], [], [], []
    for k, b in enumerate(batches):
        off, goff = len(ret), k * maps
        steps += [replace(s, episode=s.episode + off, group=s.group + goff) for s in b.steps]
        ret += b.episode_return
        succ += b.episode_success
        groups += [g + goff for g in b.episode_group]
        length += b.episode_len
    return Batch(steps, ret, succ, groups, length)


MOVES = ("up", "down", "left", "right")
FAILURE_SCORE, SUCCESS_SCORE = 0.147, 0.72  # the loop's reward service (its warehouse, 11-28)


def with_terminal(batch: Batch, mode: str) -> Batch:
    """The loop's terminal reward: the reward service's score on each episode's last step,
    as it is (`service`) or minus the mean score of its group (`centred`)."""
    if mode == "none":
        return batch
    score = np.where(np.asarray(batch.episode_success), SUCCESS_SCORE, FAILURE_SCORE)
    if mode == "centred":
        groups = np.asarray(batch.episode_group)
        for g in np.unique(groups):
            score[groups == g] -= score[groups == g].mean()
    last = {s.episode: k for k, s in enumerate(batch.steps)}
    steps = [
        replace(s, reward=s.reward + float(score[s.episode])) if last[s.episode] == k else s
        for k, s in enumerate(batch.steps)
    ]
    returns = [r + float(x) for r, x in zip(batch.episode_return, score, strict=True)]
    return Batch(steps, returns, batch.episode_success, batch.episode_group, batch.episode_len)


def diagnose(
    cfg: ValidActionConfig, policy: Any, learner: Learner, data: Batch, beta: float
) -> dict:
    """Where a job's greedy policy stands: its moves on the held-out maps, and what the
    batch it learned from said about each move."""
    greedy = rollout(cfg, policy, PromptCache(learner.tokenizer, SYSTEM_PROMPT), cfg.heldout(), 1,
                     greedy=True)  # fmt: skip
    texts = sorted({s.text for s in greedy.steps})
    with torch.no_grad():
        p = policy(texts).exp()
    adv = np.asarray(advantages(cfg, data))
    act = np.array([s.action for s in data.steps])
    w = np.minimum(np.exp(adv / beta), AWR_MAX_WEIGHT)
    played = np.bincount([s.action for s in greedy.steps], minlength=4)
    return {
        "greedy_moves": dict(zip(MOVES, played.tolist(), strict=True)),
        "argmax_states": dict(zip(MOVES, torch.bincount(p.argmax(-1), minlength=4).tolist(), strict=True)),
        "mean_p": dict(zip(MOVES, [round(float(x), 3) for x in p.mean(0)], strict=True)),
        "batch": {
            m: {"n": int((act == k).sum()), "adv": round(float(adv[act == k].mean()), 3),
                "weight_share": round(float(w[act == k].sum() / w.sum()), 3)}
            for k, m in enumerate(MOVES) if (act == k).any()
        },
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--jobs", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--acting-temperature", type=float, default=6.0, help="the loop's: 6")
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--epochs", type=int, default=20, help="x 4 minibatches = steps per job")
    p.add_argument("--beta", type=float, default=0.5, help="AWR temperature")
    p.add_argument("--window", type=int, default=1, help="a job trains on the newest N batches")
    p.add_argument("--importance", action="store_true", help="AWR weights x pi_start / pi_acting")
    p.add_argument(
        "--lag", type=int, default=0,
        help="act with the version L jobs older than the newest (the loop's live one trails)",
    )  # fmt: skip
    p.add_argument("--gamma", type=float, default=0.5, help="the loop's: 0.5 (0.99 until 11-28)")
    p.add_argument("--omega", type=float, default=1.0, help="GiGPO: A_episode + omega A_step")
    p.add_argument("--entropy", type=float, default=0.02, help="entropy bonus")
    p.add_argument(
        "--policy-temperature", type=float, default=2.0,
        help="the policy softmax(z / T) the jobs fit (the loop's: 2)",
    )  # fmt: skip
    p.add_argument(
        "--terminal", choices=("none", "service", "centred"), default="none",
        help="the loop's jobs add the reward service's score to an episode's last step:\n"
        "'service' as the loop does (0.147 for a failure: the neutral user_feedback;\n"
        "0.72 for a success), 'centred' minus its group's mean",
    )  # fmt: skip
    p.add_argument(
        "--objective", choices=("awr", "state_awr"), default="awr",
        help="the job's: awr (sample AWR) or state_awr (per-state targets from pi_start)",
    )  # fmt: skip
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: by the load)")
    p.add_argument("--maps", type=int, default=16)
    p.add_argument("--episodes", type=int, default=16, help="per map")
    p.add_argument(
        "--diagnose", action="store_true",
        help="per job also: the greedy moves on the held-out maps, the argmax and mean\n"
        "probability of each move over their distinct states, and per move of the acting\n"
        "batch its count, mean advantage and share of the AWR weight",
    )  # fmt: skip
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = ValidActionConfig(
        model="smollm2", lora_layers=2, dtype="fp32", algorithm="gigpo",
        gamma=a.gamma, gigpo_omega=a.omega,
        temperature=a.policy_temperature, learning_rate=a.learning_rate, entropy_coef=a.entropy, epochs=a.epochs,
        minibatches=4, seed=a.seed, maps_per_iteration=a.maps, episodes_per_map=a.episodes,
        threads=a.threads,
    )  # fmt: skip
    learner = Learner(cfg)
    policy = learner.logprob_fn()

    def acting(texts: list[str]) -> torch.Tensor:  # softmax(z / T_acting) from softmax(z / 2)
        return torch.log_softmax(policy(texts) * (cfg.temperature / a.acting_temperature), -1)

    generator = torch.Generator().manual_seed(a.seed)
    batches: list[Batch] = []
    t0 = time.monotonic()
    curve = []
    versions = [[q.detach().clone() for q in learner.params]]  # the base, then each job's

    def use(weights: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for q, w in zip(learner.params, weights, strict=True):
                q.copy_(w)
        learner.cache.new_version()

    for job in range(a.jobs):
        use(versions[max(0, len(versions) - 1 - a.lag)])
        cache = PromptCache(learner.tokenizer, SYSTEM_PROMPT)
        batch = rollout(cfg, acting, cache, cfg.train_seeds(job), a.episodes, generator=generator)
        use(versions[-1])
        batches.append(with_terminal(batch, a.terminal))
        learner.optimizer = torch.optim.AdamW(learner.params, lr=a.learning_rate, weight_decay=0)
        data = merged(batches[-a.window :], a.maps)
        history = train_choices(
            learner, data, objective=a.objective, beta=a.beta,
            behaviour=[s.logp for s in data.steps] if a.importance else None,
        )  # fmt: skip
        versions.append([q.detach().clone() for q in learner.params])
        held = evaluate_heldout(policy, cfg, cfg.heldout(), learner.cache)
        curve.append(held.success)
        row = {
            "job": job + 1,
            "acting_success": float(np.mean(batch.episode_success)),
            "heldout_success": held.success,
            "policy_entropy": round(history[-1]["policy_entropy"], 3),
            "wall_s": round(time.monotonic() - t0, 1),
        }
        if a.diagnose:
            row.update(diagnose(cfg, policy, learner, data, a.beta))
        print(json.dumps(row), flush=True)
    print(json.dumps({"settings": vars(a), "heldout_by_job": curve}), flush=True)


if __name__ == "__main__":
    main()
