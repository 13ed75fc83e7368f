"""Samples are built with the collector paused and end frozen out of later collections (a
job keeps them to its end); a plain pause freezes nothing and restores the collector."""

from __future__ import annotations

import gc

from training_helpers import reward, trajectory

from agentrl.contracts.training import DatasetFilter
from agentrl.training.dataset import apply_filters, gc_paused, latest_rewards
from agentrl.training.samples import build_samples


def test_samples_end_frozen_and_the_collector_restored(tokenizer):
    trajs = [trajectory(i, task=f"t{i % 3}") for i in range(12)]
    records, _ = apply_filters(
        trajs, latest_rewards([reward(t, i / 12) for i, t in enumerate(trajs)]), DatasetFilter()
    )
    frozen = gc.get_freeze_count()  # the suite's conftest froze its start-up: kept after
    gc.unfreeze()
    try:
        with gc_paused():
            assert not gc.isenabled()
            kept = [[i] for i in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() == 0 and kept
        samples, _ = build_samples(records, tokenizer)
        assert gc.isenabled()
        assert gc.get_freeze_count() >= 2 * len(samples) > 0  # each sample and its id lists
    finally:
        gc.unfreeze()
        if frozen:
            gc.freeze()
