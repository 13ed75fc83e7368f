"""An early-stopped benchmark's recorded mean depends on its episodes' outcomes only, not on
which ended first (`seed_order`): hand-made outcomes, ended in many orders, counted and
stopped by the validator's own rule against a recorded live model."""

from __future__ import annotations

import random

from agentrl.release.seed_order import SeedOrder, episode_order
from agentrl.release.validation import benchmark_bounds, settled_verdict

PLANNED = {"tool_usage": 12, "code_generation": 12, "data_analysis": 12}
TOL = 1 / 12


def _outcomes(seed: int) -> dict[tuple[str, int], bool]:
    rng = random.Random(seed)
    rates = {"tool_usage": 0.7, "code_generation": 0.4, "data_analysis": 0.55}
    return {(t, j): rng.random() < rates[t] for t, n in PLANNED.items() for j in range(n)}


def _stop_vs(ref: tuple[float, float], threshold: float = 0.0):  # type: ignore[no-untyped-def]
    def stop(tally) -> bool:  # type: ignore[no-untyped-def]
        return settled_verdict(benchmark_bounds(tally), ref, threshold, TOL) is not None

    return stop


def _play(outcomes: dict[tuple[str, int], bool], ends: list[tuple[str, int]], stop):  # type: ignore[no-untyped-def]
    """Episodes ending in `ends`' order, a few at a time (as `asyncio.wait` hands them over);
    what the benchmark records: (stopped, mean, counted per type)."""
    counter = SeedOrder(PLANNED)
    rng = random.Random(len(ends))
    at, stopped = 0, False
    while at < len(ends) and not stopped:
        batch = ends[at : at + rng.randint(1, 4)]
        at += len(batch)
        for t, j in batch:
            counter.end(t, j, outcomes[(t, j)])
        stopped = counter.advance(stop)
    won, counted = counter.won, counter.counted
    mean = sum(won[t] / counted[t] for t in PLANNED) / len(PLANNED)
    return stopped, round(mean, 12), tuple(sorted(counted.items()))


def test_the_order_interleaves_the_types_by_their_share() -> None:
    assert episode_order({"a": 2, "b": 2}) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    order = episode_order({"a": 6, "b": 3, "c": 0})
    assert sorted(order) == [("a", j) for j in range(6)] + [("b", j) for j in range(3)]
    for k in range(1, len(order) + 1):  # every prefix in proportion, within one episode
        a = sum(1 for t, _ in order[:k] if t == "a")
        assert abs(a - k * 6 / 9) <= 1
    for t in ("a", "b"):  # seeds ascending within a type
        js = [j for u, j in order if u == t]
        assert js == sorted(js)


def test_an_early_stop_records_the_same_mean_whatever_order_the_episodes_end_in() -> None:
    stopped_somewhere = 0
    for seed in range(20):
        outcomes = _outcomes(seed)
        ref = (0.55, 0.55)
        stop = _stop_vs(ref)
        episodes = list(outcomes)
        quick_wins = sorted(episodes, key=lambda e: not outcomes[e])  # wins end first
        seen = set()
        for k in range(12):
            ends = episodes[:]
            random.Random(seed * 100 + k).shuffle(ends)
            seen.add(_play(outcomes, ends, stop))
        seen.add(_play(outcomes, quick_wins, stop))
        seen.add(_play(outcomes, quick_wins[::-1], stop))
        assert len(seen) == 1, (seed, seen)
        ((stopped, mean, counted),) = seen
        # the first settled prefix of the order, computed directly from the outcomes
        order = episode_order(PLANNED)
        for k in range(1, len(order) + 1):
            prefix = order[:k]
            tally = {
                t: (sum(outcomes[e] for e in prefix if e[0] == t),
                    sum(1 for e in prefix if e[0] == t), n)
                for t, n in PLANNED.items()
            }  # fmt: skip
            if all(c for _, c, _ in tally.values()) and k < len(order) and stop(tally):
                break
        assert dict(counted) == {t: c for t, (_, c, _) in tally.items()}
        want = sum(w / c for w, c, _ in tally.values()) / len(PLANNED)
        assert mean == round(want, 12)
        stopped_somewhere += stopped
    assert stopped_somewhere >= 10  # the rule stops these benchmarks early, most of them


def test_counted_as_they_ended_the_mean_was_the_quickest_episodes() -> None:
    """What `seed_order` replaced: the rate of whichever episodes ended first. Wins ending
    first (an answer ends a tool-use episode) lifted the same outcomes' recorded mean."""
    outcomes = _outcomes(3)
    stop = _stop_vs((0.3, 0.3))
    quick_wins = sorted(outcomes, key=lambda e: not outcomes[e])
    won = dict.fromkeys(PLANNED, 0)
    played = dict.fromkeys(PLANNED, 0)
    for t, j in quick_wins:  # the old count: each episode as it ended
        won[t] += outcomes[(t, j)]
        played[t] += 1
        tally = {u: (won[u], played[u], n) for u, n in PLANNED.items()}
        if all(played.values()) and stop(tally):
            break
    as_ended = sum(won[t] / played[t] for t in PLANNED) / len(PLANNED)
    stopped, in_order, _ = _play(outcomes, quick_wins, stop)
    full = sum(outcomes.values()) / sum(PLANNED.values())
    assert stopped and as_ended == 1.0  # only wins had ended when it stopped
    assert abs(in_order - full) < abs(as_ended - full)
