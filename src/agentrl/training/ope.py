"""Off-policy estimate of a dataset job's holdout reward (`improvement_over_baseline`).

Logged tasks cannot be replayed, so the trained policy's reward on the holdout is estimated
from the logged data. The data came from the serving policy (the behaviour policy, often at
an exploring temperature), not from the base model, so both the trained and the base model
are weighted against the behaviour log-probs logged with each completion (the completion log's
`completion_logprobs`); where a turn has none, the base model's log-prob stands in (reported as
`behaviour_logged_share` < 1: then the base value is the plain mean and the estimate is only
as good as that proxy).

Per-decision weights: each turn (decision) t of a holdout trajectory gets its own
likelihood ratio w_t = pi(a_t | s_t) / mu(a_t | s_t), self-normalised over all decisions (mean
1), and the estimate is the first-order expansion of the trajectory's product of ratios:

    V(pi) - V(mu) ~= mean over trajectories of  sum_t (w_t - 1) * (R - mean R)

(exact when the turns add to the reward independently, a first-order approximation for
small policy changes otherwise; the product over a whole trajectory is unbiased but its
spread grows with the turns: a per-trajectory log-ratio spread of 2 leaves an effective
sample size of 8 of 60). The trained and the base model are both estimated this way and
`improvement_over_baseline` is their difference, with Kish's effective sample size of the
per-decision weights and a 95 % interval: a studentized bootstrap over trajectories
(bootstrap-t: each resample's difference divided by its own standard error, the spread of
the per-trajectory contributions). The percentile bootstrap it replaces covered a true 0 in
only 87-89 % of no-change jobs at low effective sample size (20 holdout trajectories, a
log-ratio spread of 2): heavy-tailed weights make the resampled differences too narrow
and skewed, and the t-pivot carries their spread into the interval. It is an off-policy
estimate, and named so wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

METHOD = "off-policy estimate: self-normalised per-decision importance sampling"
CLIP = 20.0


@dataclass(frozen=True)
class Decision:
    """One logged turn: its trajectory, that trajectory's reward and the log-prob of the
    logged action under the trained policy, the base model and the behaviour policy (None:
    not logged)."""

    trajectory_id: str
    reward: float
    logp_new: float
    logp_base: float
    logp_behaviour: float | None


@dataclass(frozen=True)
class OffPolicyEstimate:
    value_new: float
    value_base: float
    improvement: float
    ci95: tuple[float, float]
    ess: float
    ess_base: float
    decisions: int
    trajectories: int
    behaviour_logged_share: float

    def as_evaluation(self) -> dict[str, Any]:
        """The fields of a status's `evaluation_results`."""
        return {
            "holdout_reward": self.value_new,
            "base_holdout_reward": self.value_base,
            "improvement_over_baseline": self.improvement,
            "improvement_ci95_low": self.ci95[0],
            "improvement_ci95_high": self.ci95[1],
            "effective_sample_size": round(self.ess, 2),
            "effective_sample_size_base": round(self.ess_base, 2),
            "holdout_decisions": self.decisions,
            "holdout_trajectories": self.trajectories,
            "behaviour_logged_share": round(self.behaviour_logged_share, 4),
            "method": METHOD,
            "off_policy_estimate": True,
        }


def _weights(logp: np.ndarray, mu: np.ndarray | float) -> np.ndarray:
    w = np.exp(np.clip(logp - mu, -CLIP, CLIP))
    return w / w.mean()


def _gain(w: np.ndarray, centred: np.ndarray, group: np.ndarray, n: int) -> float:
    """mean over trajectories of sum_t (w_t - 1) * (R - mean R)."""
    return float(np.bincount(group, (w - 1.0) * centred, minlength=n).sum() / n)


def _influence(log_ratio: np.ndarray, centred: np.ndarray, group: np.ndarray, n: int) -> np.ndarray:
    """Each trajectory's influence on the gain (up to a constant), self-normalisation
    included: the gain is A * tau / B - C with per-trajectory means A of sum_t r_t c_t, B of
    sum_t r_t and tau of the turn counts (C, and the mean reward, drop out: the weights sum
    to the decisions), so psi_i = (tau / B) a_i + (A / B) tau_i - (A tau / B^2) b_i."""
    raw = np.exp(np.clip(log_ratio, -CLIP, CLIP))
    a = np.bincount(group, raw * centred, minlength=n)
    b = np.bincount(group, raw, minlength=n)
    turns = np.bincount(group, minlength=n).astype(np.float64)
    big_a, big_b, tau = a.mean(), b.mean(), turns.mean()
    return np.asarray((tau / big_b) * a + (big_a / big_b) * turns - (big_a * tau / big_b**2) * b)


def _kish(w: np.ndarray) -> float:
    return float(w.sum() ** 2 / (w * w).sum())


def estimate(
    decisions: list[Decision], *, resamples: int = 400, seed: int = 0
) -> OffPolicyEstimate | None:
    """The trained policy's and the base model's holdout reward, their difference with a 95 %
    bootstrap interval, and the effective sample size; None without decisions."""
    if not decisions:
        return None
    ids = sorted({d.trajectory_id for d in decisions})
    index = {t: i for i, t in enumerate(ids)}
    n = len(ids)
    group = np.array([index[d.trajectory_id] for d in decisions])
    r = np.array([d.reward for d in decisions], dtype=np.float64)
    new = np.array([d.logp_new for d in decisions], dtype=np.float64)
    base = np.array([d.logp_base for d in decisions], dtype=np.float64)
    logged = np.array([d.logp_behaviour is not None for d in decisions])
    mu = np.where(logged, [d.logp_behaviour or 0.0 for d in decisions], base)
    per_traj = np.zeros(n)
    per_traj[group] = r  # every decision of a trajectory carries its reward
    mean_r = float(per_traj.mean())

    def values(pick: np.ndarray, g: np.ndarray, m: int) -> tuple[float, float, float]:
        """(gain of new, gain of base, standard error of their difference)."""
        r_p, mu_p = r[pick], mu[pick]  # each row gathered once (this runs per resample)
        lr_new, lr_base = new[pick] - mu_p, base[pick] - mu_p
        centred = r_p - _traj_mean(r_p, g, m)
        w_new, w_base = _weights(lr_new, 0.0), _weights(lr_base, 0.0)
        gain_new = _gain(w_new, centred, g, m)
        gain_base = _gain(w_base, centred, g, m)
        psi = _influence(lr_new, centred, g, m)
        psi -= _influence(lr_base, centred, g, m)
        se = float(psi.std(ddof=1) / np.sqrt(m)) if m > 1 else 0.0
        return gain_new, gain_base, se

    all_idx = np.arange(len(decisions))
    gain_new, gain_base, se = values(all_idx, group, n)
    diff = gain_new - gain_base
    # each trajectory's decisions as one block of `order` (ascending, as flatnonzero gives
    # them): a resample's rows are gathered with array operations, not 2n small ones
    order = np.argsort(group, kind="stable")
    lengths = np.bincount(group, minlength=n)
    starts = np.cumsum(lengths) - lengths
    slots = np.arange(n)
    rng = np.random.default_rng(seed)
    pivots = []
    for _ in range(resamples):
        draw = rng.integers(0, n, n)
        lens = lengths[draw]
        g = np.repeat(slots, lens)
        within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        pick = order[np.repeat(starts[draw], lens) + within]
        a, c, se_b = values(pick, g, n)
        if se_b > 0.0:
            pivots.append((a - c - diff) / se_b)
    if not resamples:  # a checkpoint's quick score: no interval
        lo, hi = np.nan, np.nan
    elif se <= 0.0 or not pivots:  # the same policy on every logged decision
        lo = hi = diff
    else:
        t = float(np.percentile(np.abs(pivots), 95.0))  # symmetric bootstrap-t
        lo, hi = diff - t * se, diff + t * se
    return OffPolicyEstimate(
        value_new=mean_r + gain_new,
        value_base=mean_r + gain_base,
        improvement=gain_new - gain_base,
        ci95=(float(lo), float(hi)),
        ess=_kish(_weights(new, mu)),
        ess_base=_kish(_weights(base, mu)),
        decisions=len(decisions),
        trajectories=n,
        behaviour_logged_share=float(logged.mean()),
    )


def _traj_mean(r: np.ndarray, g: np.ndarray, m: int) -> float:
    """The mean reward over trajectories (each counted once, whatever its turn count)."""
    counts = np.bincount(g, minlength=m)
    sums = np.bincount(g, r, minlength=m)
    have = counts > 0
    return float((sums[have] / counts[have]).mean())
