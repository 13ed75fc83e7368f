"""Anytime-valid comparison of a new version with the live one.

Each version's mean (error indicator, or reward clipped to a known range [lo, hi]) gets a
two-sided confidence sequence from Robbins' normal mixture for sub-Gaussian observations
(Howard, Ramdas, McAuliffe, Sekhon 2021, eq. (14)): with sigma = (hi - lo) / 2, V = n sigma^2,

    |S_n - n mu| <= sqrt((V + rho) * log((V + rho) / (rho * a^2)))   for all n at once,

with probability >= 1 - a. Each version's sequence runs at a = alpha / 2, so the interval of
the difference (new - live) built from the two holds at every look with probability
>= 1 - alpha: the monitor may look every period and stop as soon as the interval excludes
the tolerance, without inflating false rollbacks (a fixed-n test peeked at every period
would). `rho` tunes where the boundary is tightest; we set rho = sigma^2 * min_samples.

When the observations are the per-session means of a version (the monitor's rewards: a
session stays on its version, so its rewards are not independent draws), the caller also
passes their sum of squares and sigma^2 is their empirical variance instead of the worst
case: the asymptotic confidence sequence of Waudby-Smith et al. 2024 ("Time-uniform central
limit theory and asymptotic confidence sequences", Thm 2.2: the same normal mixture with a
consistent variance estimate plugged in). With few sessions the estimate is pulled towards
the worst case (`PRIOR_N` pseudo-observations at (hi - lo)^2 / 4), so a handful of
alike sessions cannot make the interval narrow.

A check answers:
  fail          the new version is worse than live by more than `tolerance` (interval says so)
  pass          the new version is no worse than live by more than `tolerance`
  inconclusive  neither yet, or fewer than `min_samples` on either side
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

Verdict = Literal["pass", "fail", "inconclusive"]
PRIOR_N = 0.25  # pseudo-observations at the worst-case variance (see above)


@dataclass(frozen=True)
class Interval:
    n: int
    mean: float
    lower: float
    upper: float


def variance(n: int, total: float, sumsq: float | None, lo: float, hi: float) -> float:
    """sigma^2 of observations in [lo, hi]: the worst case without `sumsq`, else their
    empirical variance shrunk towards it by PRIOR_N pseudo-observations."""
    worst = ((hi - lo) / 2.0) ** 2
    if sumsq is None or n < 2:
        return worst
    s2 = min(worst, max(0.0, (sumsq - total * total / n) / (n - 1)))
    return ((n - 1) * s2 + PRIOR_N * worst) / (n - 1 + PRIOR_N)


def confidence_sequence(
    n: int,
    total: float,
    lo: float,
    hi: float,
    alpha: float,
    rho_samples: float,
    sumsq: float | None = None,
) -> Interval:
    """Anytime-valid two-sided interval for the mean of n observations in [lo, hi]
    (with `sumsq`, their sum of squares: the empirical-variance form)."""
    if n <= 0:
        return Interval(0, math.nan, lo, hi)
    sigma2 = variance(n, total, sumsq, lo, hi)
    if sigma2 <= 0.0:
        return Interval(n, total / n, total / n, total / n)
    rho = sigma2 * max(rho_samples, 1.0)
    v = n * sigma2
    radius = math.sqrt((v + rho) * math.log((v + rho) / (rho * alpha**2))) / n
    mean = total / n
    return Interval(n, mean, max(lo, mean - radius), min(hi, mean + radius))


@dataclass(frozen=True)
class CheckResult:
    """One metric's evidence and verdict (stored in the registry with the decision)."""

    metric: str
    verdict: Verdict
    new: Interval
    live: Interval
    diff_lower: float
    diff_upper: float
    tolerance: float
    alpha: float
    higher_is_better: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("new", "live"):  # NaN means "no data": JSON has no NaN
            if math.isnan(d[k]["mean"]):
                d[k]["mean"] = None
        return d


def compare(
    metric: str,
    new: tuple[int, float] | tuple[int, float, float],
    live: tuple[int, float] | tuple[int, float, float],
    *,
    lo: float,
    hi: float,
    higher_is_better: bool,
    tolerance: float,
    alpha: float = 0.05,
    min_samples: int = 20,
) -> CheckResult:
    """Sequential comparison of two (count, sum) summaries of observations in [lo, hi];
    (count, sum, sum of squares) summaries use the observations' own spread."""
    a = alpha / 2.0
    ni = confidence_sequence(new[0], new[1], lo, hi, a, min_samples, _sumsq(new))
    li = confidence_sequence(live[0], live[1], lo, hi, a, min_samples, _sumsq(live))
    d_lo, d_hi = ni.lower - li.upper, ni.upper - li.lower
    # Express "worse" the same way for both directions: worse = -(new - live) when higher
    # is better, +(new - live) when lower is better (error rates).
    worse_lo, worse_hi = (-d_hi, -d_lo) if higher_is_better else (d_lo, d_hi)
    if min(new[0], live[0]) < min_samples:
        verdict: Verdict = "inconclusive"
        reason = f"too few samples (new {new[0]}, live {live[0]}, need {min_samples} each)"
    elif worse_lo > tolerance:
        verdict = "fail"
        reason = f"new is worse by at least {worse_lo:.4f} (> tolerance {tolerance})"
    elif worse_hi <= tolerance:
        verdict = "pass"
        reason = f"new is worse by at most {worse_hi:.4f} (<= tolerance {tolerance})"
    else:
        verdict = "inconclusive"
        reason = f"worse by between {worse_lo:.4f} and {worse_hi:.4f}: not decided yet"
    return CheckResult(
        metric, verdict, ni, li, d_lo, d_hi, tolerance, alpha, higher_is_better, reason
    )


def _sumsq(summary: tuple[float, ...]) -> float | None:
    return float(summary[2]) if len(summary) > 2 else None
