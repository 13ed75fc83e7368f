"""Policy-gradient and preference losses, each short enough to check against its paper.

All functions are pure torch. Token tensors are shaped [N] (a flat list of action tokens)
with `seq_index` [N] naming the sequence each token belongs to, or [B, T] with a mask;
both shapes go through `aggregate`.

Aggregation (`agg`):
- "token" (default): mean over all action tokens of the batch (DAPO, Yu et al. 2025). Long
  and short answers weigh per token, so a long wrong answer is not diluted.
- "sequence": mean over tokens inside each sequence, then over sequences (the original
  GRPO, Shao et al. 2024). Every step weighs the same whatever its length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

Aggregation = Literal["token", "sequence"]
PolicyLoss = Literal["ppo_clip", "weighted_nll"]


def aggregate(
    values: torch.Tensor, seq_index: torch.Tensor, num_seqs: int, agg: Aggregation = "token"
) -> torch.Tensor:
    """Reduce per-token `values` [N] to a scalar, token- or sequence-level (see module doc)."""
    if values.numel() == 0:
        return values.sum() * 0.0
    if agg == "token":
        return values.mean()
    if agg == "sequence":
        sums = torch.zeros(num_seqs, dtype=values.dtype, device=values.device)
        sums = sums.index_add(0, seq_index, values)
        counts = torch.bincount(seq_index, minlength=num_seqs).to(values.dtype)
        present = counts > 0
        return (sums[present] / counts[present]).mean()
    raise ValueError(f"unknown aggregation {agg!r}; use 'token' or 'sequence'")


@dataclass
class PGStats:
    """Diagnostics of one policy-gradient loss evaluation (detached floats)."""

    clip_fraction: float
    approx_kl: float
    ratio_mean: float


def ppo_clip_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_epsilon: float = 0.2,
    clip_epsilon_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token (Schulman et al. 2017, eq. 7), negated as a loss.

        r = exp(logp - old_logp)
        L = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)

    `clip_epsilon_high` > `clip_epsilon` is DAPO's "clip-higher": it lets unlikely tokens
    with positive advantage grow further, which keeps entropy from collapsing.
    Returns (loss per token, bool mask of tokens where the clipped branch was taken).
    """
    eps_high = clip_epsilon if clip_epsilon_high is None else clip_epsilon_high
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_epsilon, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = clipped < unclipped
    return loss, was_clipped


def weighted_nll_token_loss(logp: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted maximum likelihood per token: `-w * log pi(a)`.

    With w = exp(A / beta) it is advantage-weighted regression (Peng et al. 2019); with w = 1
    on the kept episodes only, rejection-sampling fine-tuning (expert iteration). Unlike the
    clipped surrogate it keeps pulling over several epochs (no trust region: the weights
    are non-negative and bounded by whoever builds them)."""
    return -weights * logp


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token, from samples of pi:

    k3 = exp(ref - logp) - (ref - logp) - 1      (>= 0, unbiased, low variance)
    """
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution per row: -sum p log p."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip_epsilon: float | None = 0.2,
) -> torch.Tensor:
    """PPO's clipped value loss: 0.5 * max((V - R)^2, (V_clipped - R)^2), averaged.

    V_clipped = old_V + clip(V - old_V, -eps, eps) keeps the critic from jumping far from
    the values the advantages were computed with. `clip_epsilon=None` gives plain MSE/2.
    """
    unclipped = (values - returns) ** 2
    if clip_epsilon is None:
        return 0.5 * unclipped.mean()
    v_clipped = old_values + torch.clamp(values - old_values, -clip_epsilon, clip_epsilon)
    return 0.5 * torch.maximum(unclipped, (v_clipped - returns) ** 2).mean()


def policy_gradient_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    seq_index: torch.Tensor,
    num_seqs: int,
    *,
    clip_epsilon: float = 0.2,
    clip_epsilon_high: float | None = None,
    agg: Aggregation = "token",
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    kind: PolicyLoss = "ppo_clip",
) -> tuple[torch.Tensor, PGStats]:
    """The full per-token objective of GiGPO/GRPO/RLOO/PPO over flat action tokens:

        loss = agg(ppo_clip) + kl_coef * agg(k3(pi, ref)) - entropy_coef * agg(H)

    `advantages` are per token (a step's advantage repeated over its action tokens).
    `kind="weighted_nll"` replaces the clipped surrogate by `-A * log pi(a)` (see
    `weighted_nll_token_loss`): advantage-weighted regression and rejection sampling.
    """
    if kind == "weighted_nll":
        token_loss = weighted_nll_token_loss(logp, advantages)
        was_clipped = torch.zeros_like(logp, dtype=torch.bool)
    else:
        token_loss, was_clipped = ppo_clip_token_loss(
            logp, old_logp, advantages, clip_epsilon, clip_epsilon_high
        )
    loss = aggregate(token_loss, seq_index, num_seqs, agg)
    if ref_logp is not None and kl_coef:
        loss = loss + kl_coef * aggregate(k3_kl(logp, ref_logp), seq_index, num_seqs, agg)
    if entropy is not None and entropy_coef:
        loss = loss - entropy_coef * aggregate(entropy, seq_index, num_seqs, agg)
    with torch.no_grad():
        log_ratio = logp - old_logp
        stats = PGStats(
            clip_fraction=float(was_clipped.float().mean()) if was_clipped.numel() else 0.0,
            # k3 of old vs new: the "approx_kl" PPO implementations log.
            approx_kl=float(((log_ratio.exp() - 1) - log_ratio).mean())
            if log_ratio.numel()
            else 0.0,
            ratio_mean=float(log_ratio.exp().mean()) if log_ratio.numel() else 1.0,
        )
    return loss, stats


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPO's sigmoid loss (Rafailov et al. 2023, eq. 7) from summed sequence log-probs:

        margin = beta * ((pi_c - ref_c) - (pi_r - ref_r))
        L = -log sigmoid(margin)

    Returns (mean loss, the per-pair margins for accuracy/reward-margin metrics).
    """
    margin = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    return -F.logsigmoid(margin).mean(), margin.detach()
