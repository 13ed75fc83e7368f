"""One Ape-X replay shard, run as a Ray actor: a module without torch, so a shard's worker
process imports numpy and the config only (~2 CPU-s less a shard than importing `apex`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from agentrl.offpolicy.config import AGMConfigEntity
from agentrl.offpolicy.replay import Batch, make_replay


class ReplayShard:
    """One shard of the replay memory (run as a Ray actor)."""

    def __init__(self, shard_id: int, cfg_json: dict[str, Any], obs_dim: int) -> None:
        cfg = AGMConfigEntity.model_validate(cfg_json)
        rp = cfg.replay
        capacity = max(
            1, min(rp.capacity, cfg.total_steps) // max(1, cfg.distributed.replay_shards)
        )
        self.shard_id = shard_id
        self.replay = make_replay(
            rp.prioritized_replay,
            capacity,
            (obs_dim,),
            alpha=rp.alpha,
            eps=rp.priority_eps,
            seed=cfg.seed * 1000 + shard_id,
        )

    def add(self, data: dict[str, np.ndarray], td_errors: np.ndarray | None) -> dict[str, Any]:
        prio = None
        if td_errors is not None and self.replay.prioritized:
            from agentrl.offpolicy.replay import priorities_from_td

            prio = priorities_from_td(td_errors, self.replay.alpha, self.replay.eps)  # type: ignore[attr-defined]
        self.replay.add(
            data["obs"],
            data["actions"],
            data["rewards"],
            data["next_obs"],
            data["dones"],
            data["discounts"],
            prio,
        )
        return {
            "shard_id": self.shard_id,
            "count": len(data["actions"]),
            "stats": self.replay.priority_stats(),
        }

    def sample(self, batch_size: int, beta: float, count: int = 1) -> list[Batch]:
        """`count` batches in one round trip (empty while the shard holds too little)."""
        if len(self.replay) < batch_size:
            return []
        return [self.replay.sample(batch_size, beta) for _ in range(count)]

    def update_priorities(self, updates: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Priorities of several batches, (indices, td_errors) each, in one round trip."""
        for indices, td_errors in updates:
            self.replay.update_priorities(indices, td_errors)

    def size(self) -> int:
        return len(self.replay)
