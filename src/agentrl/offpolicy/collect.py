"""Experience collection: vectorised gymnasium envs, n-step transitions, greedy evaluation.

Gymnasium vector envs reset a finished sub-env on the *next* `step` call (autoreset
mode NEXT_STEP): that call returns the reset observation with reward 0, which is not
a real transition and is masked out here. Termination stops bootstrapping;
truncation (a time limit) does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray

from agentrl.core.errors import ConfigError

Policy = Callable[[NDArray[np.float32]], NDArray[np.int64]]


@dataclass(frozen=True)
class EnvSpec:
    obs_dim: int
    n_actions: int
    obs_kind: str  # "box" or "discrete"


def _encoder(space: gym.Space[Any]) -> tuple[EnvSpec, Callable[[np.ndarray], NDArray[np.float32]]]:
    if isinstance(space, gym.spaces.Box):
        dim = int(np.prod(space.shape))

        def box(obs: np.ndarray) -> NDArray[np.float32]:
            return np.asarray(obs, dtype=np.float32).reshape(len(obs), dim)

        return EnvSpec(dim, 0, "box"), box
    if isinstance(space, gym.spaces.Discrete):
        n = int(space.n)
        eye = np.eye(n, dtype=np.float32)

        def onehot(obs: np.ndarray) -> NDArray[np.float32]:
            return eye[np.asarray(obs, dtype=np.int64) - int(space.start)]

        return EnvSpec(n, 0, "discrete"), onehot
    raise ConfigError(
        f"observation space {space} is not supported; use a Box or Discrete observation space"
    )


class VecEnv:
    """A gymnasium vector env plus the observation encoding the Q-network expects."""

    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        try:
            self.env = gym.make_vec(
                env_id, num_envs=num_envs, vectorization_mode="vector_entry_point"
            )
        except Exception:  # no native vector version: step the copies one by one
            try:
                self.env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
            except gym.error.Error as exc:
                raise ConfigError(f"cannot make env_id {env_id!r}: {exc}") from None
        action_space = self.env.single_action_space
        if not isinstance(action_space, gym.spaces.Discrete):
            self.env.close()
            raise ConfigError(
                f"{env_id} has action space {action_space}; DQN needs a Discrete action space"
            )
        spec, self.encode = _encoder(self.env.single_observation_space)
        self.spec = EnvSpec(spec.obs_dim, int(action_space.n), spec.obs_kind)
        self.action_start = int(action_space.start)
        self.num_envs = num_envs
        self.seed = seed

    def reset(self, seed: int | None = None) -> NDArray[np.float32]:
        obs, _ = self.env.reset(seed=self.seed if seed is None else seed)
        return self.encode(obs)

    def step(
        self, actions: NDArray[np.int64]
    ) -> tuple[NDArray[np.float32], NDArray[np.float32], NDArray[np.bool_], NDArray[np.bool_]]:
        obs, rew, term, trunc, _ = self.env.step(actions + self.action_start)
        return (
            self.encode(obs),
            np.asarray(rew, dtype=np.float32),
            np.asarray(term, dtype=bool),
            np.asarray(trunc, dtype=bool),
        )

    def close(self) -> None:
        self.env.close()


@dataclass
class Transitions:
    obs: NDArray[np.float32]
    actions: NDArray[np.int64]
    rewards: NDArray[np.float32]
    next_obs: NDArray[np.float32]
    dones: NDArray[np.float32]
    discounts: NDArray[np.float32]

    def __len__(self) -> int:
        return len(self.actions)

    @staticmethod
    def concat(parts: list[Transitions]) -> Transitions:
        return Transitions(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


_FIELDS = ("obs", "actions", "rewards", "next_obs", "dones", "discounts")


class NStepAccumulator:
    """Turns per-env 1-step experience into n-step transitions, vectorised over envs.

    Each env keeps a window of up to n pending (s, a, r). A full window emits
    (s_0, a_0, sum_k gamma^k r_k, s_n, done=0, gamma^n); an episode end emits every
    pending entry j with the remaining rewards, the final observation, done=terminated
    and discount gamma^(count - j).
    """

    def __init__(self, n: int, gamma: float, num_envs: int, obs_dim: int) -> None:
        self.n, self.gamma, self.num_envs = n, gamma, num_envs
        self.obs = np.zeros((num_envs, n, obs_dim), dtype=np.float32)
        self.act = np.zeros((num_envs, n), dtype=np.int64)
        self.rew = np.zeros((num_envs, n), dtype=np.float32)
        self.count = np.zeros(num_envs, dtype=np.int64)
        self.powers = gamma ** np.arange(n + 1, dtype=np.float64)
        k = np.arange(n)
        # disc_matrix[j, k] = gamma^(k - j) for k >= j: R_j = sum_k rew_k * disc_matrix[j, k]
        self.disc_matrix = np.where(
            k[None, :] >= k[:, None], gamma ** (k[None, :] - k[:, None]), 0.0
        )

    def push(
        self,
        obs: NDArray[np.float32],
        actions: NDArray[np.int64],
        rewards: NDArray[np.float32],
        next_obs: NDArray[np.float32],
        terminated: NDArray[np.bool_],
        truncated: NDArray[np.bool_],
        valid: NDArray[np.bool_],
    ) -> Transitions | None:
        if self.n == 1:  # common case: no windows needed
            if valid.all():
                return Transitions(
                    obs,
                    actions,
                    rewards,
                    next_obs,
                    terminated.astype(np.float32),
                    np.full(len(actions), self.gamma, np.float32),
                )
            if not valid.any():
                return None
            return Transitions(
                obs[valid],
                actions[valid],
                rewards[valid],
                next_obs[valid],
                terminated[valid].astype(np.float32),
                np.full(int(valid.sum()), self.gamma, np.float32),
            )
        envs = np.flatnonzero(valid)
        pos = self.count[envs]
        self.obs[envs, pos] = obs[envs]
        self.act[envs, pos] = actions[envs]
        self.rew[envs, pos] = rewards[envs]
        self.count[envs] += 1
        parts: list[Transitions] = []
        ended = valid & (terminated | truncated)
        full = valid & ~ended & (self.count == self.n)
        if full.any():
            e = np.flatnonzero(full)
            ret = self.rew[e] @ self.powers[: self.n]
            parts.append(
                Transitions(
                    self.obs[e, 0].copy(),
                    self.act[e, 0].copy(),
                    ret.astype(np.float32),
                    next_obs[e],
                    np.zeros(len(e), np.float32),
                    np.full(len(e), self.powers[self.n], np.float32),
                )
            )
            self.obs[e] = np.roll(self.obs[e], -1, axis=1)
            self.act[e] = np.roll(self.act[e], -1, axis=1)
            self.rew[e] = np.roll(self.rew[e], -1, axis=1)
            self.count[e] -= 1
        if ended.any():
            e = np.flatnonzero(ended)
            cnt = self.count[e]
            live = np.arange(self.n)[None, :] < cnt[:, None]  # (D, n) pending entries
            rew = np.where(live, self.rew[e], 0.0)
            returns = rew @ self.disc_matrix.T  # (D, n): R_j
            disc = self.gamma ** (cnt[:, None] - np.arange(self.n)[None, :]).astype(np.float64)
            rows, cols = np.nonzero(live)
            parts.append(
                Transitions(
                    self.obs[e][rows, cols],
                    self.act[e][rows, cols],
                    returns[rows, cols].astype(np.float32),
                    next_obs[e][rows],
                    terminated[e][rows].astype(np.float32),
                    disc[rows, cols].astype(np.float32),
                )
            )
            self.count[e] = 0
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else Transitions.concat(parts)


class Evaluator:
    """Greedy evaluation: `episodes` episodes run side by side, one per sub-env.

    Each evaluation uses fresh seeds (base + 10000 * index), so a policy cannot be
    tuned to a fixed set of start states.
    """

    def __init__(self, env_id: str, episodes: int, seed: int, max_steps: int = 100_000) -> None:
        self.env = VecEnv(env_id, episodes, seed)
        self.episodes = episodes
        self.seed = seed
        self.calls = 0
        self.max_steps = max_steps

    def __call__(self, policy: Policy) -> NDArray[np.float64]:
        obs = self.env.reset(seed=self.seed + 10_000 * self.calls)
        self.calls += 1
        returns = np.zeros(self.episodes)
        running = np.ones(self.episodes, dtype=bool)
        for _ in range(self.max_steps):
            obs, rew, term, trunc = self.env.step(policy(obs))
            returns += rew * running
            running &= ~(term | trunc)
            if not running.any():
                break
        return returns

    def close(self) -> None:
        self.env.close()
