"""Ratios against the masked distribution: a tiny random model generates under a real
grammar mask (the gateway's engine, llguidance, a JSON schema), the job rebuilds the mask
from the completion row's schema hash, and the training-time log-probs under it equal the
logged ones: the importance ratio is 1 on the behaviour policy's own tokens. Without the
mask it is not (what the job had to avoid by dropping the logged log-probs)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from agentrl.llm.forward import BITMASK_KEY, PolicyHead, run_head
from agentrl.llm.samples import PolicySample, collate
from agentrl.serving.openai_types import ChatRequest
from agentrl.training.dataset import Record
from agentrl.training.masks import GrammarBook
from agentrl.training.samples import build_samples

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2}
SCHEMA = {
    "type": "object",
    "properties": {
        "thoughts": {"type": "array", "items": {"type": "string"}, "maxItems": 1},
        "tool_name": {"enum": ["calculator", "code_exe", "response"]},
        "tool_args": {
            "type": "object",
            "properties": {"text": {"type": "string", "maxLength": 12}},
            "required": ["text"],
            "additionalProperties": False,
        },
    },
    "required": ["thoughts", "tool_name", "tool_args"],
    "additionalProperties": False,
}
SPEC: dict[str, Any] = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True},
    }
}


@pytest.fixture(scope="module")
def engine() -> Any:
    from agentrl.serving.local import LocalEngine

    return LocalEngine("tiny", seed=3, tiny_kwargs=TINY, max_batch_size=4, default_max_tokens=48)


@pytest.fixture(scope="module")
def generations(engine: Any) -> list[Any]:
    """Completions sampled at temperature 1 under the schema (the behaviour policy)."""

    async def run() -> list[Any]:
        out = []
        for k in range(3):
            req = ChatRequest.model_validate(
                {
                    "model": "agentrl-policy",
                    "messages": [{"role": "user", "content": f"What is {k} + 4?"}],
                    "temperature": 1.0,
                    "max_tokens": 48,
                    **SPEC,
                }
            )
            out.append(await engine.generate(None, req))
        return out

    return asyncio.run(run())


def book_for(engine: Any) -> GrammarBook:
    vocab = int(engine.model.config.vocab_size)
    return GrammarBook.from_requests(engine.tokenizer, vocab, [SPEC])


def scored(engine: Any, samples: list[PolicySample]) -> list[torch.Tensor]:
    head = PolicyHead(engine.model)
    head.eval()
    mb = collate(samples, int(engine.tokenizer.pad_token_id or 0))
    with torch.no_grad():
        out = run_head(head, mb, "cpu", with_entropy=True)
    assert torch.isfinite(out["entropy"]).all()  # forbidden logits are finite: no NaN
    return list(out["logp"].split([len(s.action_ids) for s in samples]))


def test_the_rebuilt_mask_gives_ratio_one_on_the_behaviour_policys_tokens(
    engine: Any, generations: list[Any]
) -> None:
    book = book_for(engine)
    (key,) = book.constraints
    masked, plain = [], []
    for gen in generations:
        assert gen.constrained and gen.schema_hash == key  # the row's hash names the grammar
        ids = list(gen.completion_token_ids)
        assert len(ids) >= 8
        bitmask = book.bitmask(gen.schema_hash, ids)
        assert bitmask is not None and bitmask.shape[0] == len(ids)
        assert isinstance(bitmask, torch.Tensor) and bitmask.dtype == torch.int32
        logged = torch.tensor(gen.token_logprobs, dtype=torch.float32)
        masked.append(
            PolicySample(
                list(gen.prompt_token_ids), ids, old_logprobs=logged, meta={BITMASK_KEY: bitmask}
            )
        )
        plain.append(PolicySample(list(gen.prompt_token_ids), ids, old_logprobs=logged))
    for s, lp in zip(masked, scored(engine, masked), strict=True):
        assert s.old_logprobs is not None
        ratio = torch.exp(lp - s.old_logprobs)
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), ratio
    # the policy's unmasked log-probs: below the logged ones wherever the grammar removed mass
    gaps = [s.old_logprobs - lp for s, lp in zip(plain, scored(engine, plain), strict=True)]
    flat = torch.cat([g for g in gaps if g is not None])
    assert (flat > -1e-4).all() and float(flat.max()) > 0.1
    assert book.unmatched == 0


def test_a_row_the_grammar_rejects_or_does_not_know_falls_back(
    engine: Any, generations: list[Any]
) -> None:
    book = book_for(engine)
    gen = generations[0]
    ids = list(gen.completion_token_ids)
    assert book.bitmask("no-such-hash", ids) is None
    broken = [int(engine.tokenizer.encode("}", add_special_tokens=False)[0]), *ids]
    assert book.bitmask(gen.schema_hash, broken) is None  # a JSON object cannot start with }
    assert book.unmatched == 2


def test_build_samples_keeps_the_logged_logprobs_only_with_the_rebuilt_mask(
    engine: Any, generations: list[Any]
) -> None:
    gen = generations[1]
    row = {
        "completion_id": "c-1",
        "prompt_token_ids": list(gen.prompt_token_ids),
        "completion_token_ids": list(gen.completion_token_ids),
        "completion_logprobs": list(gen.token_logprobs),
        "constrained": True,
        "schema_hash": gen.schema_hash,
    }
    traj = {
        "trajectory_id": "t-1",
        "end_timestamp": "2026-01-01T00:00:00Z",
        "task_context": {"task_id": "k", "instructions": "What is 1 + 4?"},
        "turns": [
            {
                "turn_id": 1,
                "observation": {"type": "user_message", "content": "What is 1 + 4?"},
                "action": {"type": "response", "raw_response": "x", "completion_id": "c-1"},
            }
        ],
    }
    rec = Record(traj, {"trajectory_id": "t-1", "total_reward": 1.0})
    tok = engine.tokenizer
    (with_mask,), stats = build_samples([rec], tok, completions={"c-1": row}, constraints=[SPEC])
    assert stats.extra["masked_samples"] == 1
    assert with_mask.old_logprobs is not None and BITMASK_KEY in with_mask.meta
    assert with_mask.old_logprobs.tolist() == pytest.approx(list(gen.token_logprobs))
    (lp,) = scored(engine, [with_mask])
    assert torch.allclose(lp, with_mask.old_logprobs, atol=1e-4)
    (without,), _ = build_samples([rec], tok, completions={"c-1": row})
    assert without.old_logprobs is None and BITMASK_KEY not in without.meta


def test_ppo_clip_steps_see_no_policy_change_on_masked_behaviour_tokens(
    engine: Any, generations: list[Any]
) -> None:
    """The trainer's PPO-clip step on the logged constrained completions (same weights as
    the engine that sampled them): under the rebuilt mask the first step's ratios are 1
    (approx_kl 0, nothing clipped); with the same logged log-probs and no mask they are far
    below 1, and a negative advantage's ratio is clipped: the step saw a change that was not."""
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.trainer import PolicyTrainer

    book = book_for(engine)

    def samples(masked: bool) -> list[PolicySample]:
        out = []
        for gen in generations:
            ids = list(gen.completion_token_ids)
            meta = {BITMASK_KEY: book.bitmask(gen.schema_hash, ids)} if masked else {}
            logged = torch.tensor(gen.token_logprobs, dtype=torch.float32)
            out.append(
                PolicySample(list(gen.prompt_token_ids), ids, -1.0, old_logprobs=logged, meta=meta)
            )
        return out

    def first_step(masked: bool) -> dict[str, float]:
        cfg = TrainerConfig(
            model="tiny", lora_r=0, seed=3, batch_size=8, epochs=1, learning_rate=1e-6
        )
        trainer = PolicyTrainer.from_config(cfg, tiny_kwargs=TINY)
        (metrics,) = trainer.train_on_samples(samples(masked))
        return metrics

    on = first_step(True)
    assert on["approx_kl"] == pytest.approx(0.0, abs=1e-6) and on["clip_fraction"] == 0.0
    off = first_step(False)
    assert off["approx_kl"] > 1e-3 and off["clip_fraction"] > 0.0
