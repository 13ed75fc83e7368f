"""A play's prefix cache (each turn prefills only what is new) and its decode steps that
project only the rows whose next token is not forced, on a tiny random model: they change
the work, never the episodes: greedy play with them samples the tokens and logs the
behaviour log-probs that play without them does; and the cache lives for one play, so a
play after a training step decodes under the new weights, not K/V kept from the old ones."""

from __future__ import annotations

import pytest
import torch

from agentrl.learners import tooluse_decode
from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner
from agentrl.learners.tooluse_episodes import EpisodeRecord, PlaySettings, PlayTiming, play

TASKS = [("arithmetic", 5), ("data", 6), ("numbers", 7), ("data", 9)]
LP_TOLERANCE = 1e-4  # float32 on CPU: the same sums in another order (measured max ~3e-6)


@pytest.fixture(scope="module")
def learner(tmp_path_factory: pytest.TempPathFactory) -> ToolUseLearner:
    cfg = ToolUseConfig(
        model="tiny",
        max_steps=3,
        max_new_tokens=24,
        threads=0,
        batch_size=3,  # the fourth episode starts when one ends: a row joining the batch
        out_dir=str(tmp_path_factory.mktemp("play-cache") / "run"),
    )
    return ToolUseLearner(cfg)


def greedy(learner: ToolUseLearner, cache_mb: float, timing: PlayTiming) -> list[EpisodeRecord]:
    cfg = learner.config
    settings = PlaySettings(
        temperature=0.0,
        max_steps=cfg.max_steps,
        max_new_tokens=cfg.max_new_tokens,
        batch_size=cfg.batch_size,
        cache_mb=cache_mb,
    )
    return play(
        learner.model,
        learner.tokenizer,
        TASKS,
        settings,
        matchers=learner.matchers,
        generator=torch.Generator().manual_seed(0),
        timing=timing,
    )


def max_lp_gap(a: list[EpisodeRecord], b: list[EpisodeRecord]) -> float:
    """The largest log-prob difference of two plays that sampled the same tokens."""
    gap = 0.0
    for x, y in zip(a, b, strict=True):
        assert [t.prompt_ids for t in x.turns] == [t.prompt_ids for t in y.turns]
        assert [t.action_ids for t in x.turns] == [t.action_ids for t in y.turns]
        for s, t in zip(x.turns, y.turns, strict=True):
            gap = max([gap, *(abs(p - q) for p, q in zip(s.logprobs, t.logprobs, strict=True))])
    return gap


class _EveryRowProjected(tooluse_decode._HeadRows):
    """The play as it was: every decode step projects every row onto the vocabulary."""

    def __init__(self, model: object) -> None:
        super().__init__(model)
        self.remove()
        self.installed = False


def test_greedy_play_with_the_cache_is_play_without_it(
    learner: ToolUseLearner, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole, cached = PlayTiming(), PlayTiming()
    with monkeypatch.context() as patch:  # the reference: no cache, every row projected
        patch.setattr(tooluse_decode, "_HeadRows", _EveryRowProjected)
        plain = greedy(learner, 0, whole)
    again = greedy(learner, 64, cached)
    assert sum(len(e.turns) for e in plain) > len(TASKS)  # episodes of several turns
    assert max_lp_gap(plain, again) <= LP_TOLERANCE
    assert [(e.success, e.answered) for e in plain] == [(e.success, e.answered) for e in again]
    # the work: every prompt token is prefilled or taken from the cache, and the cache
    # took the system prompt and the conversations so far
    prompt_tokens = sum(len(t.prompt_ids) for e in plain for t in e.turns)
    assert whole.stats.cached_tokens == 0
    assert cached.stats.prefill_tokens + cached.stats.cached_tokens <= prompt_tokens
    assert cached.stats.cached_tokens > prompt_tokens / 2
    assert cached.stats.prefill_tokens < whole.stats.prefill_tokens / 2


def test_a_play_after_a_training_step_uses_the_new_weights(learner: ToolUseLearner) -> None:
    """The learner trains between plays: a second play must decode under the new weights
    (a cache kept across plays would start its turns from the old weights' K/V)."""
    before = learner.play(TASKS, 0.0)
    with torch.no_grad():  # a training step's effect: every adapter moves
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(2))
    after = learner.play(TASKS, 0.0)
    fresh = greedy(learner, 0, PlayTiming())  # no cache at all: the new weights' own play
    assert max_lp_gap(after, fresh) <= LP_TOLERANCE
    first = [lp for e in before for t in e.turns for lp in t.logprobs]
    second = [lp for e in after for t in e.turns for lp in t.logprobs]
    assert first != second  # the weights changed what is sampled or its log-probs
