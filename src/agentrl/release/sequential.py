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

Few long sessions (a handful of agents, each session dozens of episodes) give too few
sessions for a count of `min_samples` of them: `compare_clustered` takes the episodes
themselves, pooled per session, with a session-clustered (cluster-robust, CR1) variance. A
session g of n_g episodes with mean reward y_g weighs w_g = n_g / (n_g + KAPPA); the
estimate is m = sum w_g y_g / sum w_g and

    Var(m) = G / (G - 1) * sum_g w_g^2 (y_g - m)^2 / (sum w_g)^2,

which stays right however the episodes of one session depend on each other (the session is
the unit of independence; the split assigns versions per session). The confidence sequence
above runs on N_eff = (sum w)^2 / sum w^2 effective sessions with sigma^2 = N_eff * Var(m),
shrunk towards the worst case like the session means' (a few alike sessions cannot make it
narrow). With equal weights it is the session-means form exactly; an unfinished session
weighs what it has played; and a deployment with five agents concludes once each version has
a few sessions (`min_sessions`, 2 at least: one session has no spread to measure) and
`min_samples` episodes.

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
# A session's weight is n / (n + KAPPA) (n: its episodes): the efficient weights when the
# spread of rewards within a session is KAPPA times the spread between sessions' means; a
# one-episode session weighs 1/5 of a long one. Any KAPPA is valid (the variance is the
# sessions' own), it only moves the power between short and long sessions.
KAPPA = 4.0


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
    few = None
    if min(new[0], live[0]) < min_samples:
        few = f"too few samples (new {new[0]}, live {live[0]}, need {min_samples} each)"
    return _decide(metric, ni, li, tolerance, alpha, higher_is_better, few)


def _decide(
    metric: str,
    ni: Interval,
    li: Interval,
    tolerance: float,
    alpha: float,
    higher_is_better: bool,
    too_few: str | None,
) -> CheckResult:
    """The verdict from the two versions' intervals (`too_few`: why there is no verdict yet).
    "Worse" reads the same both ways: -(new - live) when higher is better, +(new - live)
    when lower is (error rates)."""
    d_lo, d_hi = ni.lower - li.upper, ni.upper - li.lower
    worse_lo, worse_hi = (-d_hi, -d_lo) if higher_is_better else (d_lo, d_hi)
    if too_few is not None:
        verdict: Verdict = "inconclusive"
        reason = too_few
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


@dataclass(frozen=True)
class Clustered:
    """Episodes in sessions, as the weighted sums the clustered variance needs: each
    session g (n_g episodes, mean reward y_g) weighs w_g = n_g / (n_g + KAPPA), and
    sw = sum w_g, swy = sum w_g y_g, sww = sum w_g^2, swwy = sum w_g^2 y_g,
    swwyy = sum w_g^2 y_g^2."""

    episodes: int = 0
    sessions: int = 0
    sw: float = 0.0
    swy: float = 0.0
    sww: float = 0.0
    swwy: float = 0.0
    swwyy: float = 0.0

    @classmethod
    def of(cls, sessions: list[tuple[int, float]]) -> Clustered:
        """From (episodes, reward total) per session: `plus` of each, summed in one pass
        (the monitor builds this every look over every session; a `plus` per session made
        an object each: 2/3 of this function's CPU)."""
        episodes = count = 0
        sw = swy = sww = swwy = swwyy = 0.0
        for n, total in sessions:
            if n <= 0:
                continue
            w, y = n / (n + KAPPA), total / n
            episodes, count = episodes + n, count + 1
            sw, swy, sww = sw + w, swy + w * y, sww + w * w
            swwy, swwyy = swwy + w * w * y, swwyy + w * w * y * y
        return cls(episodes, count, sw, swy, sww, swwy, swwyy)

    def plus(self, n: int, total: float) -> Clustered:
        if n <= 0:
            return self
        w, y = n / (n + KAPPA), total / n
        return Clustered(
            self.episodes + n,
            self.sessions + 1,
            self.sw + w,
            self.swy + w * y,
            self.sww + w * w,
            self.swwy + w * w * y,
            self.swwyy + w * w * y * y,
        )

    @property
    def mean(self) -> float:
        return self.swy / self.sw if self.sw > 0 else math.nan

    def effective(self, lo: float, hi: float) -> tuple[float, float]:
        """(N_eff, sigma^2) for the confidence sequence: N_eff = (sum w)^2 / sum w^2
        sessions and the per-session variance N_eff * Var(mean) (CR1), shrunk towards
        the worst case by PRIOR_N pseudo-sessions."""
        worst = ((hi - lo) / 2.0) ** 2
        g = self.sessions
        if g <= 0 or self.sww <= 0:
            return 0.0, worst
        n_eff = self.sw * self.sw / self.sww
        if g < 2:
            return n_eff, worst
        m = self.mean
        resid = max(0.0, self.swwyy - 2.0 * m * self.swwy + m * m * self.sww)
        var_mean = g / (g - 1) * resid / (self.sw * self.sw)
        s2 = min(worst, n_eff * var_mean)
        return n_eff, ((n_eff - 1) * s2 + PRIOR_N * worst) / (n_eff - 1 + PRIOR_N)


def clustered_sequence(
    c: Clustered, lo: float, hi: float, alpha: float, rho_samples: float
) -> Interval:
    """Anytime-valid interval for the mean reward of episodes clustered in sessions."""
    if c.episodes <= 0:
        return Interval(0, math.nan, lo, hi)
    n_eff, sigma2 = c.effective(lo, hi)
    mean = c.mean
    if sigma2 <= 0.0 or n_eff <= 0.0:
        return Interval(c.episodes, mean, mean, mean)
    rho = sigma2 * max(rho_samples, 1.0)
    v = n_eff * sigma2
    radius = math.sqrt((v + rho) * math.log((v + rho) / (rho * alpha**2))) / n_eff
    return Interval(c.episodes, mean, max(lo, mean - radius), min(hi, mean + radius))


def compare_clustered(
    metric: str,
    new: Clustered,
    live: Clustered,
    *,
    lo: float,
    hi: float,
    higher_is_better: bool,
    tolerance: float,
    alpha: float = 0.05,
    min_samples: int = 20,
    min_sessions: int = 2,
    rho_samples: float | None = None,
) -> CheckResult:
    """`compare` on episodes clustered in sessions: a verdict needs `min_samples` episodes
    and `min_sessions` sessions on each side."""
    a = alpha / 2.0
    rho = float(rho_samples if rho_samples is not None else min_sessions)
    ni = clustered_sequence(new, lo, hi, a, rho)
    li = clustered_sequence(live, lo, hi, a, rho)
    few = None
    if (
        min(new.episodes, live.episodes) < min_samples
        or min(new.sessions, live.sessions) < min_sessions
    ):
        few = (
            f"too few samples (new {new.episodes} in {new.sessions} sessions, live "
            f"{live.episodes} in {live.sessions}; need {min_samples} in {min_sessions} each)"
        )
    return _decide(metric, ni, li, tolerance, alpha, higher_is_better, few)
