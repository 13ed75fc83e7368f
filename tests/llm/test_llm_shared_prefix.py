"""A micro-batch's shared prompt prefix runs once (`forward.PolicyHead`, `share_prefix`):
the same log-probs, values and gradients as running every row whole, for less work."""

from __future__ import annotations

import pytest
import torch

from agentrl.llm.config import TrainerConfig
from agentrl.llm.forward import MIN_SHARED_PREFIX, run_head, shared_prefix_len
from agentrl.llm.loading import LoraSettings, load_policy
from agentrl.llm.samples import PolicySample, collate
from agentrl.llm.trainer import PolicyTrainer

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}


def make_trainer(share: bool, algorithm: str = "grpo") -> PolicyTrainer:
    cfg = TrainerConfig(
        model="tiny", lora_r=4, learning_rate=1e-2, batch_size=8, share_prefix=share,
        algorithm=algorithm, seed=3,
    )  # fmt: skip
    lora = LoraSettings(r=4, target_modules=("q_proj", "v_proj"))
    policy = load_policy("tiny", lora=lora, seed=3, tiny_kwargs=TINY)
    for name, p in policy.model.named_parameters():  # adapters away from zero: B moves too
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5, generator=torch.Generator().manual_seed(1))
    return PolicyTrainer(policy, cfg)


def samples() -> list[PolicySample]:
    """Tool-use-like rows: a long common system prompt, then each row's own turn."""
    g = torch.Generator().manual_seed(0)
    system = torch.randint(5, 200, (60,), generator=g).tolist()
    out = []
    for k, (own, act) in enumerate([(7, 5), (12, 3), (3, 9), (20, 6)]):
        prompt = system + torch.randint(5, 200, (own,), generator=g).tolist()
        action = torch.randint(5, 200, (act,), generator=g).tolist()
        out.append(PolicySample(prompt, action, advantage=(-1.0) ** k, old_logprobs=None))
    return out


class Positions:
    """Counts the positions the decoder runs (a hook on the token embedding)."""

    def __init__(self, trainer: PolicyTrainer) -> None:
        self.n = 0
        emb = trainer.policy.model.get_input_embeddings()
        self.handle = emb.register_forward_hook(self._count)

    def _count(self, _m: object, args: tuple[torch.Tensor, ...], _out: object) -> None:
        self.n += int(args[0].numel())


def scored(
    trainer: PolicyTrainer, apart: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, int]:
    """(log-probs, values, gradient of a loss on both, positions run) of one micro-batch."""
    trainer.head.rows_apart = apart
    mb = collate(samples(), trainer.pad_id)
    count = Positions(trainer)
    trainer.optimizer.zero_grad(set_to_none=True)
    out = run_head(trainer.head, mb, "cpu", with_entropy=True)
    loss = (out["logp"] * torch.linspace(-1, 1, out["logp"].numel())).sum()
    if "values" in out:
        loss = loss + out["values"].pow(2).sum()
    loss.backward()
    count.handle.remove()
    params = [p for p in trainer.head.parameters() if p.requires_grad]
    grad = torch.cat([p.grad.flatten() for p in params if p.grad is not None])
    values = out["values"].detach() if "values" in out else None
    return out["logp"].detach(), values, grad, count.n


@pytest.mark.parametrize("apart", [True, False])
def test_the_shared_prefix_gives_the_same_logprobs_and_gradients_for_less_work(apart) -> None:
    whole = scored(make_trainer(share=False))
    shared = scored(make_trainer(share=True), apart)
    torch.testing.assert_close(shared[0], whole[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[2], whole[2], atol=1e-6, rtol=1e-4)
    assert shared[2].abs().sum() > 0
    mb = collate(samples(), 0)
    rows, width = mb.input_ids.shape
    assert whole[3] == rows * width
    # the 60 system tokens once, not four times (the rows' first scored position bounds
    # it); apart, no padded position runs either
    own = int(mb.attention_mask.sum()) - rows * 60 if apart else rows * (width - 60)
    assert shared[3] == 60 + own


def test_a_cpu_runs_the_rows_apart_by_default() -> None:
    mb = collate(samples(), 0)
    assert scored(make_trainer(share=True))[3] == int(mb.attention_mask.sum()) - 3 * 60


@pytest.mark.parametrize("apart", [True, False])
def test_ppo_values_read_the_same_position_after_the_prefix(apart) -> None:
    whole = scored(make_trainer(share=False, algorithm="ppo"))
    shared = scored(make_trainer(share=True, algorithm="ppo"), apart)
    assert whole[1] is not None and shared[1] is not None
    torch.testing.assert_close(shared[1], whole[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[2], whole[2], atol=1e-6, rtol=1e-4)


def test_a_training_step_moves_the_weights_the_same() -> None:
    def after(share: bool) -> torch.Tensor:
        trainer = make_trainer(share=share)
        trainer.train_on_samples(samples())
        return torch.cat([p.detach().flatten() for p in trainer.head.parameters()])

    before = torch.cat([p.detach().flatten() for p in make_trainer(True).head.parameters()])
    whole, shared = after(False), after(True)
    assert not torch.allclose(whole, before)
    torch.testing.assert_close(shared, whole, atol=1e-6, rtol=1e-5)


def test_shared_prefix_len_bounds() -> None:
    ids = torch.tensor([[1] * 40 + [2, 3, 0], [1] * 40 + [4, 5, 6]])
    mask = torch.tensor([[1] * 42 + [0], [1] * 43])
    assert shared_prefix_len(ids, mask, first=41) == 40
    assert shared_prefix_len(ids, mask, first=35) == 35  # the earliest scored position
    assert shared_prefix_len(ids[:1], mask[:1], first=41) == 0  # one row: nothing to share
    assert shared_prefix_len(ids, mask, first=MIN_SHARED_PREFIX - 1) == 0  # too short
    other = ids.clone()
    other[1, 3] = 9  # rows part at position 3
    assert shared_prefix_len(other, mask, first=41) == 0
