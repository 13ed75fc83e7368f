"""What a dataset job optimises on its token-level samples: one pure function per objective
(the names are `training.jobspec`'s, shared with the choices trainer; `ppo` is `pg`).

`pg` (default)  the samples' advantages as they are, under PPO's clipped surrogate with the
                behaviour log-probs as old log-probs (GRPO / RLOO / GiGPO credit, see
                `training.samples`; GiGPO's step rewards are the reward service's per-turn
                partial credit where it gives one). A constrained completion whose grammar
                the job rebuilds (`hyperparameters.constraints`, `training.masks`) keeps its
                logged log-probs and is scored under the same mask: the ratio compares the
                masked distributions;
`awr`           advantage-weighted regression (Peng et al. 2019): weighted maximum likelihood
                of the logged tokens with w = exp(A / beta), capped at `max_weight` and
                normalised to mean 1 over the batch, so good turns are imitated more
                strongly and bad ones barely;
`rs`            rejection sampling (expert iteration, STaR): maximum likelihood of the turns
                of trajectories whose reward is at least `min_reward` (the seed's filter),
                weight 1, the rest dropped.

`awr` and `rs` train with `policy_loss="weighted_nll"`: no importance ratio, so the
distribution the behaviour log-probs came from (a grammar's mask) does not enter the loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from agentrl.core.errors import TrainingError

OBJECTIVES = ("pg", "awr", "rs")


def policy_loss_of(objective: str) -> str:
    return "ppo_clip" if objective == "pg" else "weighted_nll"


def shape_samples(
    samples: Sequence[Any],
    objective: str,
    *,
    beta: float = 0.5,
    max_weight: float = 20.0,
    min_reward: float = 1.0,
) -> list[Any]:
    """The samples the objective trains on, with its weights as their `advantage`."""
    if objective not in OBJECTIVES:
        raise TrainingError(
            f"objective {objective!r}: use one of {', '.join(OBJECTIVES)}", "CONFIG"
        )
    if objective == "pg":
        return [s for s in samples if abs(s.advantage) > 1e-8]
    if objective == "rs":
        return [replace(s, advantage=1.0) for s in samples if s.reward >= min_reward]
    if beta <= 0 or max_weight <= 0:
        raise TrainingError("awr needs awr_beta > 0 and awr_max_weight > 0", "CONFIG")
    cap = math.log(max_weight)
    weights = [math.exp(min(s.advantage / beta, cap)) for s in samples]
    mean = sum(weights) / len(weights) if weights else 1.0
    return [replace(s, advantage=w / mean) for s, w in zip(samples, weights, strict=True)]
