"""Masked ratios on the tool-use loop job's real path (issue 52): the gateway's engine serves
a version's LoRA adapters (on the top layers, as the warm start has them) and samples under
the loop's reply schema; the job loads that version as it continues one (`init_lora_shape`,
`continue_from`), rebuilds the grammar from the loop's `constraints` and scores the logged
tokens under it. The ratio against the logged log-probs is 1: the engine's per-row LoRA and
the trainer's peft LoRA are one policy, and the mask is the one that was sampled under.
(`tests/llm/test_masked_ratios.py` checks the mask on a base model without adapters.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

from agentrl.app import loop_tooluse
from agentrl.learners.tooluse import ToolUseConfig, ToolUseLearner
from agentrl.llm.config import TrainerConfig
from agentrl.llm.forward import BITMASK_KEY, run_head
from agentrl.llm.samples import PolicySample, collate
from agentrl.llm.trainer import PolicyTrainer
from agentrl.serving.openai_types import ChatRequest
from agentrl.training.jobs import continue_from, init_lora_shape
from agentrl.training.masks import GrammarBook

# one system prompt for every request, as the loop's agents send Agent Zero's: the engine's
# system-prompt K/V cache is used from the second request on
SYSTEM = {"role": "system", "content": "You are Agent Zero. Reply in JSON with a tool."}


def version(tmp_path: Path) -> str:
    """A version with adapters on the top layer only that change the policy."""
    cfg = ToolUseConfig(
        model="tiny", threads=0, warm_start=False, lora_layers=1, structured=False,
        out_dir=str(tmp_path / "w"),
    )  # fmt: skip
    start = ToolUseLearner(cfg)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in start.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return start.save("warmstart", {})


def test_the_jobs_ratio_is_one_on_the_gateways_constrained_lora_samples(tmp_path: Path) -> None:
    from agentrl.serving.local import LocalEngine

    folder = version(tmp_path)
    engine = LocalEngine("tiny", seed=0, max_batch_size=4, default_max_tokens=32)
    engine.load_adapter("v1", Path(folder))
    spec = {"response_format": loop_tooluse.response_format()}

    async def sample() -> list[Any]:
        out = []
        for k in range(2):
            req = ChatRequest.model_validate(
                {"model": "v1", "messages": [SYSTEM, {"role": "user", "content": f"What is {k} + 4?"}],
                 "temperature": 1.0, "max_tokens": 32, **spec}
            )  # fmt: skip
            out.append(await engine.generate("v1", req))
        return out

    gens = asyncio.run(sample())
    shape = init_lora_shape(folder)
    job = PolicyTrainer.from_config(
        TrainerConfig(model="tiny", storage_path=str(tmp_path / "job"), **shape), None
    )
    continue_from(job, folder)
    book = GrammarBook.from_requests(
        job.policy.tokenizer, int(job.policy.model.config.vocab_size), [spec]
    )
    samples = []
    for g in gens:
        ids = list(g.completion_token_ids)
        assert g.constrained and len(ids) >= 4
        mask = book.bitmask(g.schema_hash, ids)
        assert mask is not None
        logged = torch.tensor(g.token_logprobs, dtype=torch.float32)
        samples.append(
            PolicySample(list(g.prompt_token_ids), ids, old_logprobs=logged, meta={BITMASK_KEY: mask})
        )  # fmt: skip
    job.head.eval()
    with torch.no_grad():
        out = run_head(job.head, collate(samples, job.pad_id), "cpu")
    new = out["logp"].float()
    old = torch.cat([s.old_logprobs for s in samples if s.old_logprobs is not None])
    ratio = torch.exp(new - old)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=2e-3), ratio
    # and without the version's adapters (the base) the ratio is not 1: the test can fail
    with torch.no_grad(), job.policy.model.disable_adapter():
        base = run_head(job.head, collate(samples, job.pad_id), "cpu")["logp"].float()
    assert float((base - old).abs().max()) > 0.05
