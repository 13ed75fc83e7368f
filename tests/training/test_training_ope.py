"""The holdout off-policy estimate against a simulated agent whose true values are known.

Logged data comes from a serving policy at an exploring temperature (mu = softmax(theta/1.5)),
the base model is softmax(theta) and the trained one softmax(theta + delta); four turns per
trajectory, each turn's action adds r(a)/4 to the trajectory's reward (plus noise), 60
holdout trajectories as in the issue. The old estimator (whole-trajectory weights of
new/base, the plain mean of the behaviour's data as the base value) is biased and noisier;
the new one is close, its 95 % interval covers the truth, and it reports its effective
sample size."""

from __future__ import annotations

import numpy as np

from agentrl.training.jobs import snis_reward
from agentrl.training.ope import METHOD, Decision, estimate

K, TURNS, TRAJ = 6, 4, 60
REWARD = np.linspace(0.0, 1.0, K)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


THETA = np.array([0.0, 0.4, 0.2, 0.6, 0.3, 0.5]) * 3
MU = _softmax(THETA / 1.5)
BASE = _softmax(THETA)


def _trained(target: float) -> np.ndarray:
    """A policy tilted towards high rewards until its true gain over BASE is `target`."""
    lo, hi = 0.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        gain = _softmax(THETA + mid * REWARD) @ REWARD - BASE @ REWARD
        lo, hi = (mid, hi) if gain < target else (lo, mid)
    return _softmax(THETA + lo * REWARD)


def _simulate(
    new: np.ndarray, rng: np.random.Generator, trajectories: int = TRAJ
) -> list[Decision]:
    out = []
    for i in range(trajectories):
        acts = rng.choice(K, size=TURNS, p=MU)
        total = float(REWARD[acts].mean() + rng.normal(0, 0.05))
        for a in acts:
            out.append(
                Decision(
                    f"t{i}",
                    total,
                    float(np.log(new[a])),
                    float(np.log(BASE[a])),
                    float(np.log(MU[a])),
                )
            )
    return out


def _old(decisions: list[Decision]) -> float:
    """What the job reported before: trajectory-level SNIS of new/base, base = plain mean."""
    new: dict[str, float] = {}
    base: dict[str, float] = {}
    rewards: dict[str, float] = {}
    for d in decisions:
        new[d.trajectory_id] = new.get(d.trajectory_id, 0.0) + d.logp_new
        base[d.trajectory_id] = base.get(d.trajectory_id, 0.0) + d.logp_base
        rewards[d.trajectory_id] = d.reward
    est = snis_reward(new, base, rewards)
    assert est is not None
    return est - float(np.mean(list(rewards.values())))


def test_estimate_is_close_to_the_truth_and_its_interval_covers_it() -> None:
    new = _trained(0.10)
    truth = float(new @ REWARD - BASE @ REWARD)
    assert abs(truth - 0.10) < 1e-6
    rng = np.random.default_rng(7)
    errors, old_errors, covered, ess = [], [], 0, []
    runs = 60
    for run in range(runs):
        decisions = _simulate(new, rng)
        est = estimate(decisions, resamples=200, seed=run)
        assert est is not None
        errors.append(est.improvement - truth)
        old_errors.append(_old(decisions) - truth)
        covered += est.ci95[0] <= truth <= est.ci95[1]
        ess.append(est.ess)
    bias, old_bias = float(np.mean(errors)), float(np.mean(old_errors))
    assert abs(bias) < 0.01, bias
    assert abs(bias) < abs(old_bias), (bias, old_bias)  # the old base value is mu's
    assert covered >= 0.8 * runs, covered
    assert min(ess) > 0.5 * TRAJ * TURNS  # per-decision weights keep most of the sample


def test_noisy_policy_change_per_decision_beats_whole_trajectory_weights() -> None:
    """A trained policy that differs from the base by noise in its logits (per-trajectory
    log-ratio spread about 2, as in the issue): smaller error than the old estimator."""
    rng = np.random.default_rng(3)
    errors, old_errors = [], []
    for run in range(40):
        new = _softmax(THETA + rng.normal(0, 1.2, K))
        truth = float(new @ REWARD - BASE @ REWARD)
        decisions = _simulate(new, rng)
        est = estimate(decisions, resamples=20, seed=run)
        assert est is not None
        errors.append(est.improvement - truth)
        old_errors.append(_old(decisions) - truth)
    rmse = float(np.sqrt(np.mean(np.square(errors))))
    old_rmse = float(np.sqrt(np.mean(np.square(old_errors))))
    assert rmse < old_rmse, (rmse, old_rmse)


def test_no_change_reads_zero_and_the_fields_name_the_method() -> None:
    rng = np.random.default_rng(1)
    decisions = _simulate(BASE, rng)
    est = estimate(decisions, resamples=100)
    assert est is not None
    assert est.improvement == 0.0 and est.ci95 == (0.0, 0.0)
    ev = est.as_evaluation()
    assert ev["method"] == METHOD and "off-policy estimate" in ev["method"]
    assert ev["off_policy_estimate"] is True
    assert ev["holdout_trajectories"] == TRAJ and ev["holdout_decisions"] == TRAJ * TURNS
    assert ev["behaviour_logged_share"] == 1.0 and ev["effective_sample_size"] > 0
    assert estimate([]) is None


def test_without_logged_behaviour_log_probs_the_base_model_stands_in() -> None:
    rng = np.random.default_rng(2)
    decisions = [
        Decision(d.trajectory_id, d.reward, d.logp_new, d.logp_base, None)
        for d in _simulate(_trained(0.1), rng)
    ]
    est = estimate(decisions, resamples=50)
    assert est is not None
    assert est.behaviour_logged_share == 0.0
    assert abs(est.value_base - np.mean([d.reward for d in decisions[::TURNS]])) < 1e-9


def _no_gain(rng: np.random.Generator, spread: float) -> np.ndarray:
    """A trained policy that differs from the base (noise of `spread` in its logits) but
    whose true holdout reward is the base's: a job that changed nothing that matters."""
    noise = rng.normal(0, spread, K)
    lo, hi = -30.0, 30.0
    for _ in range(80):
        mid = (lo + hi) / 2
        gain = _softmax(THETA + noise + mid * REWARD) @ REWARD - BASE @ REWARD
        lo, hi = (mid, hi) if gain < 0 else (lo, mid)
    return _softmax(THETA + noise + lo * REWARD)


def test_no_change_jobs_at_low_ess_are_covered_by_the_interval() -> None:
    """Issue 49: 20 holdout trajectories and a log-ratio spread of 2 (effective sample size
    25-40 of 80 decisions): the percentile bootstrap's "95 %" interval covered the true 0
    in 89 % of such jobs; the symmetric bootstrap-t's covers it in at least 93 %."""
    rng = np.random.default_rng(0)
    runs, covered, ess = 200, 0, []
    for run in range(runs):
        new = _no_gain(rng, 2.0)
        assert abs(float(new @ REWARD - BASE @ REWARD)) < 1e-9
        est = estimate(_simulate(new, rng, trajectories=20), resamples=200, seed=run)
        assert est is not None
        covered += est.ci95[0] <= 0.0 <= est.ci95[1]
        ess.append(est.ess)
    assert float(np.median(ess)) < 0.6 * 20 * TURNS  # low ESS indeed
    assert covered / runs >= 0.93, covered / runs
