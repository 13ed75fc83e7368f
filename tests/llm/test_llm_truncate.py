"""Defect 10: truncation kept log-probs recorded on the full prompt and mutated its input."""

from __future__ import annotations

import pytest
import torch

from agentrl.llm.config import TrainerConfig
from agentrl.llm.loading import load_policy
from agentrl.llm.samples import PolicySample, truncate
from agentrl.llm.trainer import PolicyTrainer


def sample(prompt: int, action: int, with_logprobs: bool) -> PolicySample:
    return PolicySample(
        prompt_ids=list(range(10, 10 + prompt)),
        action_ids=list(range(500, 500 + action)),
        advantage=1.0,
        old_logprobs=torch.full((action,), -0.5) if with_logprobs else None,
    )


def test_truncate_never_mutates_its_input() -> None:
    s = sample(20, 4, with_logprobs=False)
    before = list(s.prompt_ids)
    cut = truncate(s, 16)
    assert s.prompt_ids == before and "truncated_tokens" not in s.meta
    assert cut is not s and cut.prompt_ids == before[-12:] and cut.meta["truncated_tokens"] == 8


def test_a_sample_with_behaviour_logprobs_is_never_cut() -> None:
    with pytest.raises(ValueError, match="misalign"):
        truncate(sample(20, 4, with_logprobs=True), 16)
    fits = sample(10, 4, with_logprobs=True)
    assert truncate(fits, 16) is fits


def test_trainer_drops_and_counts_samples_it_cannot_cut_and_first_ratio_is_one() -> None:
    cfg = TrainerConfig(model="tiny", algorithm="grpo", max_length=24, learning_rate=1e-3)
    trainer = PolicyTrainer.from_config(cfg)
    long = sample(30, 4, with_logprobs=True)
    short = sample(12, 4, with_logprobs=False)
    kept = trainer.prepare([long, short])
    assert trainer.dropped_too_long == 1
    assert len(kept) == 1 and kept[0].prompt_ids == short.prompt_ids
    assert long.prompt_ids == list(range(10, 40))  # the caller's sample is untouched
    # The kept sample's old log-probs were scored on exactly the context it trains on.
    trainer.score(kept, force_old=True)
    again = [PolicySample(**{**kept[0].__dict__})]
    trainer.score(again, force_old=True)
    assert torch.allclose(kept[0].old_logprobs, again[0].old_logprobs, atol=1e-6)


def test_load_policy_tiny_is_available() -> None:
    assert load_policy("tiny").model is not None
