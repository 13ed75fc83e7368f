"""The fast warm start (`learners.tooluse_warm`) computes the same log-probs as the plain
per-turn forward (`sft.sft_epoch`'s path) on the tiny model: one sequence per episode, the
frozen layers precomputed, the system prompt shared; and an epoch lowers the loss."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner, demonstrations, solved_episodes
from agentrl.learners.tooluse_warm import FastSFT, episode_sequences
from agentrl.llm.forward import run_head
from agentrl.llm.samples import make_microbatches

TASKS = [("arithmetic", 3), ("data", 5), ("numbers", 4), ("data", 8)]


def _learner(tmp_path: Path, lora_layers: int | None) -> ToolUseLearner:
    cfg = ToolUseConfig(
        model="tiny", threads=0, lora_layers=lora_layers, out_dir=str(tmp_path / "run")
    )
    return ToolUseLearner(cfg)


def _plain_logprobs(learner: ToolUseLearner, samples: list) -> torch.Tensor:
    trainer = learner.trainer
    out = []
    for s in samples:  # one at a time: the order of the targets is the samples' order
        mb = make_microbatches([s], 10**6, trainer.pad_id)[0]
        out.append(run_head(trainer.module, mb, trainer.device)["logp"])
    return torch.cat(out)


def test_one_sequence_per_episode_holds_every_reply(tmp_path: Path, smol_tokenizer) -> None:
    episodes = solved_episodes(4, TASKS)
    seqs = episode_sequences(smol_tokenizer, episodes)
    learner = _learner(tmp_path, 1)
    samples = demonstrations(learner, TASKS)
    assert len(samples) == 2 * len(episodes) == 8
    assert len(seqs) == len(episodes)  # the replies line up inside the last prompt
    targets = [s.ids[t] for s in seqs for t in s.targets]
    assert targets == [i for s in samples for i in s.action_ids]


def test_fast_logprobs_equal_the_plain_forward(tmp_path: Path) -> None:
    learner = _learner(tmp_path, 1)  # tiny has 2 layers: the bottom one is frozen
    torch.manual_seed(1)
    with torch.no_grad():  # non-zero adapters, so the adapted layer matters
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    learner.model.eval()
    episodes = solved_episodes(4, TASKS)
    fast = FastSFT(learner.model, episode_sequences(learner.tokenizer, episodes), 1)
    assert fast.prefix > 16  # the system prompt is shared
    with torch.no_grad():
        got = fast.logprobs(list(range(len(episodes))))
        want = _plain_logprobs(learner, demonstrations(learner, TASKS))
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=2e-4), (got - want).abs().max()
    # and not by accident: the adapters change the log-probs
    with torch.no_grad(), learner.model.disable_adapter():
        base = _plain_logprobs(learner, demonstrations(learner, TASKS))
    assert not torch.allclose(base, want, atol=1e-3)


def test_an_epoch_lowers_the_loss(tmp_path: Path) -> None:
    learner = _learner(tmp_path, None)
    learner.set_lr(5e-3)
    episodes = solved_episodes(4, TASKS)
    fast = FastSFT(learner.model, episode_sequences(learner.tokenizer, episodes), 0)
    with torch.no_grad():
        before = float(-fast.logprobs([0, 1, 2, 3]).mean())
    for _ in range(3):
        fast.epoch(learner.trainer, 2)
    with torch.no_grad():
        after = float(-fast.logprobs([0, 1, 2, 3]).mean())
    assert after < before - 0.1, (before, after)
