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
RESAMPLE_BLOCK = 64  # bootstrap resamples computed together


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


def _influence(
    raw: np.ndarray, centred: np.ndarray, group: np.ndarray, turns: np.ndarray
) -> np.ndarray:
    """Each trajectory's influence on the gain (up to a constant), self-normalisation
    included: the gain is A * tau / B - C with per-trajectory means A of sum_t r_t c_t, B of
    sum_t r_t and tau of the turn counts (C, and the mean reward, drop out: the weights sum
    to the decisions), so psi_i = (tau / B) a_i + (A / B) tau_i - (A tau / B^2) b_i.
    Per sample: `turns` is (samples, trajectories), `raw` the unnormalised ratios."""
    k, n = turns.shape
    a = np.bincount(group, raw * centred, minlength=k * n).reshape(k, n)
    b = np.bincount(group, raw, minlength=k * n).reshape(k, n)
    big_a = a.mean(axis=1, keepdims=True)
    big_b = b.mean(axis=1, keepdims=True)
    tau = turns.mean(axis=1, keepdims=True)
    return np.asarray((tau / big_b) * a + (big_a / big_b) * turns - (big_a * tau / big_b**2) * b)


def _segment_means(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The mean of each consecutive segment of `x` (`rows` long each), as `x.mean()` of
    each: one reshape when the segments are equally long (every trajectory as many turns)."""
    if (rows == rows[0]).all():
        return np.asarray(x.reshape(len(rows), int(rows[0])).mean(axis=1))
    ends = np.cumsum(rows)
    return np.array([x[e - m : e].mean() for e, m in zip(ends, rows, strict=True)])


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
    # each trajectory's decisions as one block of `order` (ascending, as flatnonzero gives
    # them): a sample's rows are gathered with array operations, not 2n small ones
    order = np.argsort(group, kind="stable")
    lengths = np.bincount(group, minlength=n)
    starts = np.cumsum(lengths) - lengths

    def values(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per sample (a row of `draws`: the trajectories it drew), the gain of new, the
        gain of base and the standard error of their difference, all samples at once (one
        by one, ~30 small array operations per bootstrap resample: 0.08 s for 200)."""
        k = len(draws)
        lens = lengths[draws].ravel()
        g = np.repeat(np.arange(k * n), lens)  # sample s's j-th draw: group s * n + j
        within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        pick = order[np.repeat(starts[draws.ravel()], lens) + within]
        rows = lens.reshape(k, n).sum(axis=1)  # each sample's rows (consecutive)
        r_p, mu_p = r[pick], mu[pick]
        counts = np.bincount(g, minlength=k * n)
        sums = np.bincount(g, r_p, minlength=k * n)
        # the mean reward over a sample's trajectories (each counted once, whatever its turns)
        traj_mean = (sums / counts).reshape(k, n).mean(axis=1)
        centred = r_p - np.repeat(traj_mean, rows)
        turns = counts.reshape(k, n).astype(np.float64)
        gains, psis = [], []
        for logp in (new, base):
            raw = np.exp(np.clip(logp[pick] - mu_p, -CLIP, CLIP))
            w = raw / np.repeat(_segment_means(raw, rows), rows)  # mean 1 in each sample
            # mean over trajectories of sum_t (w_t - 1) * (R - mean R)
            gain = np.bincount(g, (w - 1.0) * centred, minlength=k * n).reshape(k, n)
            gains.append(gain.sum(axis=1) / n)
            psis.append(_influence(raw, centred, g, turns))
        psi = psis[0] - psis[1]
        se = psi.std(ddof=1, axis=1) / np.sqrt(n) if n > 1 else np.zeros(k)
        return gains[0], gains[1], se

    whole = values(np.arange(n)[None, :])
    gain_new, gain_base, se = (float(v[0]) for v in whole)
    diff = gain_new - gain_base
    rng = np.random.default_rng(seed)
    pivots: list[float] = []
    for first in range(0, resamples, RESAMPLE_BLOCK):  # memory: a block's rows at a time
        # drawn one resample after another: a seed draws the trajectories it always drew
        block = min(RESAMPLE_BLOCK, resamples - first)
        draws = np.stack([rng.integers(0, n, n) for _ in range(block)])
        a, c, se_b = values(draws)
        ok = se_b > 0.0
        pivots.extend(((a[ok] - c[ok] - diff) / se_b[ok]).tolist())
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
