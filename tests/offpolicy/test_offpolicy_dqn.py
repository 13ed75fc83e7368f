"""Double-DQN targets by hand, the update rule, n-step transitions, envs and evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.core.errors import ConfigError
from agentrl.offpolicy.collect import Evaluator, NStepAccumulator, VecEnv
from agentrl.offpolicy.config import build_config
from agentrl.offpolicy.dqn import DQNLearner, double_dqn_targets, parameters_checksum, td_loss
from agentrl.offpolicy.replay import PrioritizedReplay


def test_double_dqn_target_hand_example() -> None:
    # two transitions, three actions
    q_next_online = torch.tensor([[1.0, 5.0, 2.0], [0.0, 0.0, 3.0]])
    q_next_target = torch.tensor([[10.0, 4.0, 20.0], [7.0, 8.0, 9.0]])
    rewards = torch.tensor([1.0, 2.0])
    dones = torch.tensor([0.0, 1.0])
    discounts = torch.tensor([0.9, 0.81])
    y = double_dqn_targets(rewards, dones, discounts, q_next_online, q_next_target)
    # row 0: online argmax = action 1 -> target value 4 (not the target's own max 20)
    # y0 = 1 + 0.9 * 4 = 4.6 ; row 1 is terminal: y1 = 2
    torch.testing.assert_close(y, torch.tensor([4.6, 2.0]))
    vanilla = double_dqn_targets(
        rewards, dones, discounts, q_next_online, q_next_target, double=False
    )
    torch.testing.assert_close(vanilla, torch.tensor([1.0 + 0.9 * 20.0, 2.0]))


def test_weighted_losses() -> None:
    q, y = torch.tensor([0.0, 0.0]), torch.tensor([0.5, 3.0])
    w = torch.tensor([1.0, 0.5])
    # huber(0.5) = 0.125, huber(3) = 2.5 ; mean(1*0.125, 0.5*2.5) = 0.6875
    assert float(td_loss(q, y, w, "huber")) == pytest.approx(0.6875)
    assert float(td_loss(q, y, w, "mse")) == pytest.approx((0.25 + 0.5 * 9) / 2)
    with pytest.raises(ValueError):
        td_loss(q, y, w, "l1")


def _batch(n: int = 64, obs_dim: int = 4, seed: int = 0) -> PrioritizedReplay:
    rng = np.random.default_rng(seed)
    buf = PrioritizedReplay(1000, (obs_dim,), seed=seed)
    buf.add(
        rng.standard_normal((n, obs_dim)).astype(np.float32),
        rng.integers(0, 2, n),
        rng.random(n).astype(np.float32),
        rng.standard_normal((n, obs_dim)).astype(np.float32),
        (rng.random(n) < 0.1).astype(np.float32),
        np.full(n, 0.99, np.float32),
    )
    return buf


def test_update_clips_gradients_and_syncs_target_on_schedule() -> None:
    cfg = build_config(
        {
            "network": {"hidden": [16]},
            "kernel_smoothing": {"latent_dim": 8},
            "optimiser": {"lr": 1e-2, "max_grad_norm": 0.5},
            "dqn": {"target_update": "hard", "target_update_interval": 3},
        }
    )
    learner = DQNLearner(cfg, 4, 2)
    buf = _batch()
    before = parameters_checksum(learner.target.state_dict())
    for i in range(1, 4):
        batch = buf.sample(32, 0.5)
        expected = learner.td_errors(batch)  # the TD errors that become the new priorities
        stats, td = learner.update(batch)
        assert td.shape == (32,) and np.isfinite(stats.loss)
        np.testing.assert_allclose(td, expected, rtol=1e-5, atol=1e-6)
        if i < 3:
            assert parameters_checksum(learner.target.state_dict()) == before
    # after the 3rd update the target is an exact copy of the online network
    assert parameters_checksum(learner.target.state_dict()) == parameters_checksum(
        learner.online.state_dict()
    )
    # the clip bounds the applied gradient norm (grad_norm reports the norm before clipping)
    total = torch.sqrt(
        sum(p.grad.square().sum() for p in learner.online.parameters() if p.grad is not None)
    )
    assert float(total) <= 0.5 + 1e-4


def test_polyak_target_moves_by_tau() -> None:
    cfg = build_config(
        {
            "network": {"hidden": [8]},
            "kernel_smoothing": {"latent_dim": 4},
            "dqn": {"target_update": "polyak", "tau": 0.25},
        }
    )
    learner = DQNLearner(cfg, 4, 2)
    t0 = [p.detach().clone() for p in learner.target.parameters()]
    learner.update(_batch().sample(16))
    for old, new, online in zip(
        t0, learner.target.parameters(), learner.online.parameters(), strict=True
    ):
        torch.testing.assert_close(new, old + 0.25 * (online.detach() - old))


def test_update_with_smoothing_and_free_energy_terms() -> None:
    cfg = build_config(
        {
            "network": {"hidden": [16]},
            "kernel_smoothing": {
                "enabled": True, "latent_dim": 8, "k": 4, "trust_region_tau": 0.05,
                "consensus_reg": 0.1, "free_energy_weight": 0.01,
            },
        }
    )  # fmt: skip
    learner = DQNLearner(cfg, 4, 2)
    stats, _ = learner.update(_batch().sample(32))
    assert stats.smoothing is not None and stats.smoothing.applied
    assert stats.smoothing.max_update_norm <= 0.05 * (1 + 1e-5)
    assert np.isfinite(stats.fe_F) and stats.fe_F == pytest.approx(
        stats.fe_U - stats.fe_S, rel=1e-4
    )
    latent = build_config(
        {"kernel_smoothing": {"enabled": True, "apply_to": "latents", "latent_dim": 8}}
    )
    stats, _ = DQNLearner(latent, 4, 2).update(_batch().sample(32))
    assert stats.smoothing is not None and tuple(stats.smoothing.dh.shape) == (32, 8)


def test_nstep_accumulator_returns_discounts_and_episode_ends() -> None:
    acc = NStepAccumulator(n=3, gamma=0.5, num_envs=2, obs_dim=1)
    out = []
    for t in range(5):
        obs = np.array([[t], [10 + t]], np.float32)
        tr = acc.push(
            obs, np.array([t, t]), np.array([1.0, 2.0], np.float32), obs + 1,
            terminated=np.array([t == 4, False]), truncated=np.array([False, t == 3]),
            valid=np.array([True, t <= 3]),
        )  # fmt: skip
        if tr is not None:
            out += [
                (
                    float(tr.obs[i, 0]),
                    float(tr.rewards[i]),
                    float(tr.next_obs[i, 0]),
                    float(tr.dones[i]),
                    float(tr.discounts[i]),
                )
                for i in range(len(tr))
            ]
    expected = {
        (0.0, 1.75, 3.0, 0.0, 0.125),  # r0 + .5 r1 + .25 r2, bootstrap from s3 with gamma^3
        (1.0, 1.75, 4.0, 0.0, 0.125),
        (2.0, 1.75, 5.0, 1.0, 0.125),  # env 0 terminates at t=4: flush with done=1
        (3.0, 1.5, 5.0, 1.0, 0.25),
        (4.0, 1.0, 5.0, 1.0, 0.5),
        (10.0, 3.5, 13.0, 0.0, 0.125),
        (11.0, 3.5, 14.0, 0.0, 0.125),  # env 1 truncated at t=3: flush, keep bootstrapping
        (12.0, 3.0, 14.0, 0.0, 0.25),
        (13.0, 2.0, 14.0, 0.0, 0.5),
    }
    assert len(out) == len(expected) and set(out) == expected


def test_one_step_accumulator_masks_reset_steps() -> None:
    acc = NStepAccumulator(n=1, gamma=0.9, num_envs=3, obs_dim=2)
    obs = np.zeros((3, 2), np.float32)
    f = np.zeros(3, bool)
    tr = acc.push(
        obs,
        np.array([0, 1, 0]),
        np.ones(3, np.float32),
        obs,
        f,
        f,
        valid=np.array([True, False, True]),
    )
    assert tr is not None and len(tr) == 2 and np.allclose(tr.discounts, 0.9)
    assert acc.push(obs, np.zeros(3, np.int64), np.ones(3, np.float32), obs, f, f, valid=f) is None


def test_env_checks_and_evaluation() -> None:
    with pytest.raises(ConfigError, match="Discrete action space"):
        VecEnv("Pendulum-v1", 2, 0)
    env = VecEnv("FrozenLake-v1", 2, 0)  # Discrete observations are one-hot encoded
    assert env.spec.obs_dim == 16 and env.reset().shape == (2, 16)
    env.close()
    ev = Evaluator("CartPole-v1", 5, seed=0)
    always_left = ev(lambda obs: np.zeros(len(obs), np.int64))
    assert always_left.shape == (5,) and always_left.max() < 20  # falls over quickly
    second = ev(lambda obs: np.zeros(len(obs), np.int64))
    assert not np.array_equal(always_left, second)  # fresh start states each evaluation
    ev.close()
