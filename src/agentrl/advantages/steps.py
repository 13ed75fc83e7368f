"""GiGPO on the rollout worker's `StepData` lists (seed 002, Task 2.4).

`system_apply_gigpo_to_batch_steps` flattens a batch of episodes into rows, hashes each
step's observation into an anchor, calls the vectorised `gigpo_advantages`, and writes
`advantage` and `return_to_go` back onto the StepData objects.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from agentrl.advantages.gigpo import Combine, EpisodeBaseline, GiGPOResult, Mode, gigpo_advantages

if TYPE_CHECKING:
    from agentrl.core.episodes import StepData

DEFAULT_LAST_N_MESSAGES = 2


def default_state_hash(observation_data: Any, last_n: int = DEFAULT_LAST_N_MESSAGES) -> Hashable:
    """The anchor of a step: what the environment looks like, without the conversation.

    - a dict with a non-None "anchor" (every `agentrl.envs` observation, and the rollout
      worker's observation_data): that anchor;
    - a dict with "messages" (the worker's observation_data when the environment gave no
      anchor): as a list of messages, below;
    - a list of messages (Message objects or OpenAI dicts): a digest of the last `last_n`
      messages' role, name and content, so two episodes that reached the same tool result
      share a state even if their earlier turns differ;
    - a string: the string; anything else: a digest of its JSON (or repr).
    """
    if isinstance(observation_data, dict):
        anchor = observation_data.get("anchor")
        if anchor is not None:
            return anchor if isinstance(anchor, Hashable) else _digest(anchor)
        if "messages" in observation_data:
            return default_state_hash(observation_data["messages"], last_n)
        return _digest(observation_data)
    if isinstance(observation_data, str):
        return observation_data
    if isinstance(observation_data, (list, tuple)):
        tail = observation_data[-last_n:] if last_n > 0 else []
        return _digest([_message_key(m) for m in tail])
    return _digest(observation_data)


def _message_key(message: Any) -> Any:
    if isinstance(message, dict):
        return [message.get("role"), message.get("name"), message.get("content")]
    if hasattr(message, "role") and hasattr(message, "content"):
        return [message.role, getattr(message, "name", None), message.content]
    return message


def _digest(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def system_apply_gigpo_to_batch_steps(
    batch_of_step_data_lists: Sequence[list[StepData]],
    final_scores_for_rollouts: Sequence[float],
    omega: float,
    gamma: float,
    state_hashing_function: Callable[[Any], Hashable] | None = None,
    default_step_reward: float = 0.0,
    *,
    group_ids: Sequence[Hashable] | None = None,
    combine: Combine = "convex",
    mode: Mode = "mean_std_norm",
    episode_baseline: EpisodeBaseline = "trajectories",
    epsilon: float = 1e-6,
    similarity_threshold: float | None = None,
    final_score_at_last_step: bool = True,
) -> list[list[StepData]]:
    """Fill `advantage` and `return_to_go` of every StepData; returns the same lists.

    Step reward r_t = base_reward (or `default_step_reward` where it is None), plus the
    rollout's final score on its last step (the seed's rule; pass
    `final_score_at_last_step=False` when base_reward already holds the environment's terminal
    reward and the final score is the same success counted again). return_to_go is the discounted return G_t (this
    path is critic-free). `group_ids` says which rollouts started from the same task and seed
    (one id per rollout); by default the whole batch is one group, as the seed assumes the
    caller batched one task's rollouts. Empty rollouts are skipped.
    """
    n_rollouts = len(batch_of_step_data_lists)
    if len(final_scores_for_rollouts) != n_rollouts:
        raise ValueError(
            f"final_scores_for_rollouts has {len(final_scores_for_rollouts)} scores for "
            f"{n_rollouts} rollouts; pass one score per rollout"
        )
    if group_ids is not None and len(group_ids) != n_rollouts:
        raise ValueError(f"group_ids has {len(group_ids)} ids for {n_rollouts} rollouts")
    hash_fn = state_hashing_function or default_state_hash
    lengths = np.fromiter((len(s) for s in batch_of_step_data_lists), np.int64, n_rollouts)
    n = int(lengths.sum())
    if n == 0:
        return list(batch_of_step_data_lists)

    steps = [step for episode in batch_of_step_data_lists for step in episode]
    rewards = np.fromiter(
        (default_step_reward if s.base_reward is None else s.base_reward for s in steps),
        np.float64,
        n,
    )
    episode_rows = np.repeat(np.arange(n_rollouts, dtype=np.int64), lengths)
    scores = np.asarray(final_scores_for_rollouts, dtype=np.float64)
    if not np.isfinite(scores).all():
        raise ValueError("final_scores_for_rollouts contains NaN or inf; fix the reward")
    last_rows = np.cumsum(lengths)[lengths > 0] - 1
    if final_score_at_last_step:
        rewards[last_rows] += scores[lengths > 0]
    groups: Any = (
        np.zeros(n, dtype=np.int64)
        if group_ids is None
        else np.repeat(np.asarray(_codes(group_ids), dtype=np.int64), lengths)
    )
    anchors = [hash_fn(s.observation_data) for s in steps]
    result: GiGPOResult = gigpo_advantages(
        groups,
        episode_rows,
        anchors,
        rewards,
        scores[episode_rows],
        gamma=gamma,
        omega=omega,
        combine=combine,
        mode=mode,
        epsilon=epsilon,
        episode_baseline=episode_baseline,
        similarity_threshold=similarity_threshold,
        step_index=np.fromiter((s.system_step_index for s in steps), np.int64, n),
    )
    for step, adv, ret in zip(
        steps, result.advantages.tolist(), result.step_returns.tolist(), strict=True
    ):
        step.advantage = adv
        step.return_to_go = ret
    return list(batch_of_step_data_lists)


def _codes(ids: Sequence[Hashable]) -> list[int]:
    table: dict[Hashable, int] = {}
    return [table.setdefault(i, len(table)) for i in ids]


def turn_rewards_of(reward: Any, n_steps: int) -> list[float] | None:
    """The per-turn rewards of a reward payload (`metadata.turn_rewards`, written by the
    reward service when partial credit is on: each turn's credit, the outcome on the last;
    they sum to the total), or None when it has none for `n_steps` turns."""
    meta = reward.get("metadata") if isinstance(reward, dict) else None
    values = meta.get("turn_rewards") if isinstance(meta, dict) else None
    if not isinstance(values, list) or len(values) != n_steps:
        return None
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError):
        return None
    return out if all(np.isfinite(out)) else None


def set_turn_rewards(steps: Sequence[StepData], reward: Any) -> bool:
    """Put a reward's per-turn rewards on an episode's steps as `base_reward` (then call
    `system_apply_gigpo_to_batch_steps(..., final_score_at_last_step=False)`: the last
    turn's reward already holds the outcome). False, and nothing changed, when the reward
    has no per-turn rewards for these steps."""
    values = turn_rewards_of(reward, len(steps))
    if values is None:
        return False
    for step, value in zip(steps, values, strict=True):
        step.base_reward = value
    return True
