"""A benchmark's episodes counted in one fixed order, so an early stop records a mean that
depends on the episodes' outcomes alone, not on which of them ended first.

Counted as they ended, a stopped benchmark's rate was that of its quickest episodes (in tool
use an answer ends an episode, a wrong turn plays on to the step limit): the same candidate
recorded 0.25 beside the live model and 0.417 alone (s32), and `best_waiting` compares those
means. Here an episode counts once every episode before it in the order has ended, and the
stop is asked after each counted episode, so it lands on the first settled prefix of the
order. The order interleaves the task types by their share (with equal counts: one episode
of each type in turn, seeds ascending), so every prefix has each type in proportion.
"""

from __future__ import annotations

from collections.abc import Callable

Tally = dict[str, tuple[int, int, int]]  # task type -> (successes, counted, planned)


def episode_order(planned: dict[str, int]) -> list[tuple[str, int]]:
    """(task type, its episode index) in counting order: episode j of a type of n sits at
    (j + 1) / n of the way, ties in the types' order."""
    types = list(planned)
    keyed = [((j + 1) / n, types.index(t), t, j) for t, n in planned.items() for j in range(n)]
    return [(t, j) for _, _, t, j in sorted(keyed)]


class SeedOrder:
    """The episodes' outcomes as they end, counted in `episode_order`."""

    def __init__(self, planned: dict[str, int]) -> None:
        self.planned = dict(planned)
        self.order = episode_order(self.planned)
        self.won = dict.fromkeys(self.planned, 0)
        self.counted = dict.fromkeys(self.planned, 0)
        self._ended: dict[tuple[str, int], bool] = {}
        self._next = 0  # the first position of the order not counted yet

    def end(self, task_type: str, index: int, success: bool) -> None:
        """An episode ended (in any order); it counts once those before it have."""
        self._ended[(task_type, index)] = success

    def tally(self) -> Tally:
        return {t: (self.won[t], self.counted[t], n) for t, n in self.planned.items()}

    def advance(self, stop: Callable[[Tally], bool] | None = None) -> bool:
        """Count the ended episodes next in the order; after each one, once every type has
        one counted, ask `stop(tally)`. True when it said stop (nothing after that episode
        counts)."""
        while self._next < len(self.order) and self.order[self._next] in self._ended:
            t, j = self.order[self._next]
            self.won[t] += int(self._ended.pop((t, j)))
            self.counted[t] += 1
            self._next += 1
            every = all(self.counted[u] for u, n in self.planned.items() if n)
            if stop is not None and every and self._next < len(self.order) and stop(self.tally()):
                return True
        return False
