"""Keeping what was learned: a replay of verified successes, per family (issue 52, item 4).

The replay holds the replies of episodes the environment verified as solved: the learner's
own hint-free successes and, when there was one, the warm start's scripted episodes. After
each RL update the learner takes supervised steps on a family-balanced draw from it,
interleaved with the RL steps (ReLIFT, arXiv 2506.07527: RL on what the model can already
do, supervised steps on solutions it cannot yet sample, alternating); a family the current
iteration had no success in is still trained on, so one family's successes do not pull the
policy away from the others (the ablation's job drifted to the calculator).

Balance per tool of the opening turn (`sample(balance_openings=True)`): the start writes a
thought, then calls the tool that thought names, and every update so far moved which thought
opens a reply across families toward the tool it trained most (a family-balanced pass of the
harness's replay, 4 episodes a family, opens about 3.5 with the calculator and 8.5 with
`code_exe`, data and numbers calling it: arithmetic's first tool went calculator -> `code_exe`,
2026-12-01). Balanced, a pass opens as many episodes with each tool the replay holds.

The loop's jobs build theirs from the trajectories they read: `tooluse_job_replay`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from agentrl.envs.tooluse.agent_prompt import TOOLS as REPLIES
from agentrl.learners.tooluse_hints import TokenItem

TOOLS = tuple(t for t in REPLIES if t != "response")  # what an opening turn can call


class Replay:
    """Verified successes by family, the newest `capacity` episodes of each."""

    def __init__(self, capacity_per_family: int = 64) -> None:
        if capacity_per_family <= 0:
            raise ValueError("capacity_per_family must be positive")
        self.capacity = capacity_per_family
        # per family: (source, the episode's replies, the tool its first reply calls or None)
        self._episodes: dict[str, deque[tuple[str, list[TokenItem], str | None]]] = {}
        self.added: dict[str, int] = {}  # by source ("own", "warm start")

    def add(
        self,
        family: str,
        items: Sequence[TokenItem],
        source: str = "own",
        opening: str | None = None,
    ) -> None:
        """One solved episode's replies (hint-free prompts, plain NLL items); `opening`: the
        tool the first of them calls when it is the episode's first reply (None: unknown, or
        no first reply among them), what `sample` balances."""
        if not items:
            return
        if any(it.mode != "nll" for it in items):
            raise ValueError("the replay holds verified successes only (nll items)")
        q = self._episodes.setdefault(family, deque(maxlen=self.capacity))
        kept = [TokenItem(list(it.prompt_ids), list(it.action_ids), family) for it in items]
        q.append((source, kept, opening))
        self.added[source] = self.added.get(source, 0) + 1

    def add_episodes(self, episodes: Iterable[Any], source: str = "own") -> int:
        """The solved ones among learner episodes (`EpisodeRecord`); returns how many."""
        from agentrl.learners.tooluse_hints import success_items

        n = 0
        for ep in episodes:
            if ep.success and not ep.hint:
                first = ep.turns[0] if ep.turns else None
                opening = first.tool_name if first is not None and first.finish == "stop" else None
                self.add(ep.family, success_items([ep]), source, opening)
                n += 1
        return n

    def families(self) -> list[str]:
        return sorted(f for f, q in self._episodes.items() if q)

    def held(self, family: str) -> list[list[TokenItem]]:
        """The replies (token items) of each episode the replay holds for `family`."""
        return [items for _, items, _ in self._episodes.get(family, ())]

    def openings(self) -> dict[str, int]:
        """Episodes held per tool of their opening turn (the tools `sample` balances)."""
        out: dict[str, int] = {}
        for q in self._episodes.values():
            for _, _, tool in q:
                if tool in TOOLS:
                    out[tool] = out.get(tool, 0) + 1
        return out

    def __len__(self) -> int:
        return sum(len(q) for q in self._episodes.values())

    def sample(
        self,
        episodes_per_family: int,
        generator: torch.Generator,
        balance_openings: bool = False,
    ) -> list[TokenItem]:
        """`episodes_per_family` episodes of every family held (with replacement when a
        family holds fewer), as fresh NLL items: the same count from each family. With
        `balance_openings`, then episodes opening with each under-drawn tool are added
        (a family holding such episodes drawn in turn at random, then one of its episodes)
        until the pass opens as many episodes with every tool the replay holds: the pass
        grows, the family draw stays as it was."""
        picks: list[tuple[str, int]] = []
        for family in self.families():
            n = len(self._episodes[family])
            draw = torch.randint(n, (episodes_per_family,), generator=generator).tolist()
            picks.extend((family, i) for i in draw)
        if balance_openings and picks:
            picks.extend(self._top_up(picks, generator))
        out: list[TokenItem] = []
        for family, i in picks:
            _, items, opening = self._episodes[family][i]
            for k, it in enumerate(items):
                tool = opening if k == 0 else None
                out.append(
                    TokenItem(list(it.prompt_ids), list(it.action_ids), family, opening=tool)
                )
        return out

    def _top_up(
        self, picks: Sequence[tuple[str, int]], generator: torch.Generator
    ) -> list[tuple[str, int]]:
        """Episodes that bring every tool the replay holds up to the most-drawn tool's count
        of opening turns among `picks`."""
        pools: dict[str, dict[str, list[int]]] = {}  # tool -> family -> episode indices
        for family, q in self._episodes.items():
            for i, (_, _, tool) in enumerate(q):
                if tool in TOOLS:
                    pools.setdefault(tool, {}).setdefault(family, []).append(i)
        drawn = {tool: 0 for tool in pools}
        for family, i in picks:
            tool = self._episodes[family][i][2]
            if tool in drawn:
                drawn[tool] += 1
        target = max(drawn.values(), default=0)
        extra: list[tuple[str, int]] = []
        for tool in sorted(pools):
            families = sorted(pools[tool])
            for _ in range(target - drawn[tool]):
                f = families[int(torch.randint(len(families), (1,), generator=generator))]
                idx = pools[tool][f]
                extra.append((f, idx[int(torch.randint(len(idx), (1,), generator=generator))]))
        return extra


def opening_counts(items: Iterable[TokenItem]) -> dict[str, int]:
    """Opening turns per tool among `items` (a pass)."""
    out: dict[str, int] = {}
    for it in items:
        if it.opening is not None:
            out[it.opening] = out.get(it.opening, 0) + 1
    return out
