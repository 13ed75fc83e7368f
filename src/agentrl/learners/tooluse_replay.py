"""Keeping what was learned: a replay of verified successes, per family (issue 52, item 4).

The replay holds the replies of episodes the environment verified as solved: the learner's
own hint-free successes and, when there was one, the warm start's scripted episodes. After
each RL update the learner takes supervised steps on a family-balanced draw from it,
interleaved with the RL steps (ReLIFT, arXiv 2506.07527: RL on what the model can already
do, supervised steps on solutions it cannot yet sample, alternating); a family the current
iteration had no success in is still trained on, so one family's successes do not pull the
policy away from the others (the ablation's job drifted to the calculator).

The loop's jobs build theirs from the trajectories they read: `tooluse_job_replay`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from agentrl.learners.tooluse_hints import TokenItem


class Replay:
    """Verified successes by family, the newest `capacity` episodes of each."""

    def __init__(self, capacity_per_family: int = 64) -> None:
        if capacity_per_family <= 0:
            raise ValueError("capacity_per_family must be positive")
        self.capacity = capacity_per_family
        self._episodes: dict[str, deque[tuple[str, list[TokenItem]]]] = {}
        self.added: dict[str, int] = {}  # by source ("own", "warm start")

    def add(self, family: str, items: Sequence[TokenItem], source: str = "own") -> None:
        """One solved episode's replies (hint-free prompts, plain NLL items)."""
        if not items:
            return
        if any(it.mode != "nll" for it in items):
            raise ValueError("the replay holds verified successes only (nll items)")
        q = self._episodes.setdefault(family, deque(maxlen=self.capacity))
        q.append(
            (source, [TokenItem(list(it.prompt_ids), list(it.action_ids), family) for it in items])
        )
        self.added[source] = self.added.get(source, 0) + 1

    def add_episodes(self, episodes: Iterable[Any], source: str = "own") -> int:
        """The solved ones among learner episodes (`EpisodeRecord`); returns how many."""
        from agentrl.learners.tooluse_hints import success_items

        n = 0
        for ep in episodes:
            if ep.success and not ep.hint:
                self.add(ep.family, success_items([ep]), source)
                n += 1
        return n

    def families(self) -> list[str]:
        return sorted(f for f, q in self._episodes.items() if q)

    def held(self, family: str) -> list[list[TokenItem]]:
        """The replies (token items) of each episode the replay holds for `family`."""
        return [items for _, items in self._episodes.get(family, ())]

    def __len__(self) -> int:
        return sum(len(q) for q in self._episodes.values())

    def sample(self, episodes_per_family: int, generator: torch.Generator) -> list[TokenItem]:
        """`episodes_per_family` episodes of every family held (with replacement when a
        family holds fewer), as fresh NLL items: the same count from each family."""
        out: list[TokenItem] = []
        for family in self.families():
            q = self._episodes[family]
            picks = torch.randint(len(q), (episodes_per_family,), generator=generator).tolist()
            for i in picks:
                out.extend(
                    TokenItem(list(it.prompt_ids), list(it.action_ids), family) for it in q[i][1]
                )
        return out
