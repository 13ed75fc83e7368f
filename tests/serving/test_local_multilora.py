"""Many LoRA adapters over one base in the local engine (issue 53's lineages): per-row
adapters in one batch give each row the tokens it gets served alone and the logits peft
gives; adapters load and unload while others decode and no request is lost; memory grows
by about one adapter per adapter. Tiny random base, real checkpoints, real forward passes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.serving.decoding import BatchDecoder, DecodeRow, decode_all
from agentrl.serving.openai_types import ChatRequest
from deploy_helpers import TINY, write_checkpoint


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Six adapters of different weights; one of another rank and targets (q,k,v,o r=8)."""
    root = tmp_path_factory.mktemp("many")
    out = [write_checkpoint(root / f"a{i}", seed=200 + i) for i in range(5)]
    out.append(_checkpoint(root / "wide", seed=299, r=8, targets=("q_proj", "k_proj", "o_proj")))
    return out


def _checkpoint(folder: Path, seed: int, r: int, targets: tuple[str, ...]) -> str:
    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.loading import LoraSettings, apply_lora, load_policy
    from agentrl.llm.trainer import PolicyTrainer

    policy = load_policy("tiny", seed=0, tiny_kwargs=TINY)
    policy.lora = LoraSettings(r=r, target_modules=targets)
    policy.model = apply_lora(policy.model, policy.lora)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    cfg = TrainerConfig(model="tiny", lora_r=r, storage_path=str(folder))
    return CheckpointManager(str(folder)).save(PolicyTrainer(policy, cfg), {}, name="final")


def _engine(**kw: Any) -> Any:
    from agentrl.serving.local import LocalEngine

    return LocalEngine("tiny", seed=0, tiny_kwargs=TINY, default_max_tokens=16, **kw)


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(5, 400, (7 + 2 * i,), generator=g).tolist() for i in range(n)]


def _decode(engine: Any, prompts: list[list[int]], adapters: list[str]) -> list[list[int]]:
    dec = BatchDecoder(
        engine._forward,
        eos_ids=set(),
        pad_id=engine.pad_id,
        generator=torch.Generator().manual_seed(0),
    )
    rows = [
        DecodeRow(p, adapter=a, temperature=0.0, max_new_tokens=10)
        for p, a in zip(prompts, adapters, strict=True)
    ]
    with torch.no_grad():
        return [r.toks for r in decode_all(dec, rows)]


def test_stacked_adapters_give_peft_s_logits(many: list[str]) -> None:
    """The stacked path computes what peft computes for each adapter (scale, ranks padded,
    modules an adapter does not target), and nothing when a row is the base."""
    from peft import PeftModel

    engine = _engine()
    for i, path in enumerate(many):
        engine.load_adapter(f"m{i}", Path(path))
    names = [engine.adapters[f"m{i}"] for i in range(len(many))]
    ids = torch.tensor(_prompts(1) * (len(many) + 1))
    with torch.no_grad():
        mixed = engine._forward([*names, "__base__"], input_ids=ids).logits
        base = engine.model(input_ids=ids[:1]).logits
    assert torch.allclose(mixed[-1:], base, atol=1e-5)
    import copy

    from agentrl.llm.loading import load_policy

    # one base (seed 0, as the engine's), copied for each adapter: peft wraps the model it is
    # given, and a load_policy per adapter read the tokenizer six times (~0.5-1 CPU-s each)
    fresh = load_policy("tiny", seed=0, tiny_kwargs=TINY).model
    for i, path in enumerate(many):
        ref = PeftModel.from_pretrained(copy.deepcopy(fresh), path)
        with torch.no_grad():
            want = ref.eval()(input_ids=ids[:1]).logits
        assert not torch.allclose(want, base, atol=1e-3)  # the adapter changes the logits
        assert torch.allclose(mixed[i : i + 1], want, atol=1e-4), i


@pytest.mark.parametrize("n", [1, 4, 6])
def test_n_adapters_in_one_batch_give_each_row_its_tokens_alone(many: list[str], n: int) -> None:
    engine = _engine()
    for i, path in enumerate(many[:n]):
        engine.load_adapter(f"m{i}", Path(path))
    names = [engine.adapters[f"m{i}"] for i in range(n)]
    prompts = _prompts(12)
    adapters = [names[i % n] if i % 5 else "__base__" for i in range(12)]  # base rows too
    together = _decode(engine, prompts, adapters)
    alone = [_decode(engine, [p], [a])[0] for p, a in zip(prompts, adapters, strict=True)]
    assert together == alone
    # and the adapters matter: the same prompt under each adapter decodes differently
    assert len({tuple(t) for t in _decode(engine, [prompts[0]] * n, names)}) == n


async def test_loading_and_unloading_while_others_decode_loses_nothing(many: list[str]) -> None:
    """Requests of four versions decode while a fifth loads and one of the four unloads:
    every request is answered, each with the tokens its version gives alone, the unloaded
    version's in-flight rows finish with its adapter, and its weights go afterwards."""
    engine = _engine(max_batch_size=5, max_wait_ms=2.0)  # room for one more
    for i in range(4):
        engine.load_adapter(f"m{i}", Path(many[i]))

    def req(i: int, tokens: int) -> ChatRequest:
        return ChatRequest(
            model="x",
            messages=[{"role": "user", "content": f"question {i}"}],
            max_tokens=tokens,
            temperature=0.0,
        )

    # a row per version (two each before): the tokens alone are decoded one request at a
    # time, 120 steps each (that pass was most of the test's CPU); the batched rows'
    # agreement with their rows alone at any count is test_n_adapters_in_one_batch's
    expected = {i: (await engine.generate(f"m{i}", req(i, 120))) for i in range(4)}
    tasks = {i: asyncio.create_task(engine.generate(f"m{i}", req(i, 120))) for i in range(4)}
    while engine.stats.active == 0:
        await asyncio.sleep(0.002)
    steps = engine.stats.decode.decode_steps
    await engine.run(engine.load_adapter, "m4", Path(many[4]))  # no batch drains for it
    await engine.run(engine.unload_adapter, "m3")  # rows of m3 decoding now keep it
    assert "m4" in engine.adapters_loaded() and "m3" not in engine.adapters_loaded()
    gone = expected[3]
    assert any(not t.done() for t in tasks.values()), "the batch ended before the changes"
    late = await engine.generate("m4", req(99, 5))  # served while the batch decodes
    results = {i: await t for i, t in tasks.items()}
    for i in range(4):
        assert results[i].completion_token_ids == expected[i].completion_token_ids, i
    assert engine.stats.decode.decode_steps > steps
    assert late.completion_tokens == 5
    # the unloaded version's slot went once its rows ended (its rows had their own tokens)
    assert engine.lora.names() == [engine.adapters[f"m{i}"] for i in (0, 1, 2, 4)]
    assert not engine.lora.has_retired()
    base = await engine.generate(None, req(3, 120))
    assert gone.completion_token_ids != base.completion_token_ids


def test_memory_grows_by_one_adapter_per_adapter(many: list[str]) -> None:
    """Each adapter adds its own weights' bytes to the stacks (the same rank and targets:
    exactly; the tensors are the engine's only copy) and unloading gives them back."""
    engine = _engine()
    one = None
    sizes = []
    for i in range(5):
        engine.load_adapter(f"m{i}", Path(many[i]))
        mem = engine.adapter_memory()
        sizes.append(mem["stacked"])
        one = one or mem["weights"]
        assert mem["adapters"] == i + 1 and mem["weights"] == one * (i + 1)
    # slot 0 is the base (zeros): N adapters hold N + 1 slots
    assert sizes == [one * (i + 2) for i in range(5)]
    for i in range(5):
        engine.unload_adapter(f"m{i}")
    assert engine.adapter_memory() == {"adapters": 0, "weights": 0, "stacked": 0}


def test_bad_adapters_get_a_clear_error(tmp_path: Path, many: list[str]) -> None:
    import json
    import shutil

    from agentrl.serving.errors import DeployError

    engine = _engine()
    dora = tmp_path / "dora"
    shutil.copytree(many[0], dora)
    cfg = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(DeployError, match="DoRA"):
        engine.load_adapter("dora", dora)
    assert engine.adapters_loaded() == {}


def test_rows_of_many_adapters_sharing_a_system_prompt_prefill_in_one_pass(
    many: list[str],
) -> None:
    """Each lineage's agents send the same system prompt: its K/V differs per adapter, but
    the rest of every row's prompt runs in one forward pass (the prefixes stacked by row),
    not one pass per adapter, and each row still gets its tokens alone."""
    from agentrl.serving.decoding import PrefixCache

    engine = _engine()
    for i, path in enumerate(many[:4]):
        engine.load_adapter(f"m{i}", Path(path))
    names = [engine.adapters[f"m{i}"] for i in range(4)]
    system = torch.randint(5, 400, (32,), generator=torch.Generator().manual_seed(3)).tolist()
    prompts = [system + p for p in _prompts(8)]
    adapters = [names[i % 4] for i in range(8)]
    passes: list[int] = []

    def forward(rows: list[str], **kw: Any) -> Any:
        passes.append(len(rows))
        return engine._forward(rows, **kw)

    cache = PrefixCache(2**26)
    for cached in (False, True):  # the prefixes computed, then taken from the cache
        dec = BatchDecoder(
            forward,
            eos_ids=set(),
            pad_id=engine.pad_id,
            generator=torch.Generator().manual_seed(0),
            prefix_cache=cache,
        )
        rows = [
            DecodeRow(p, adapter=a, temperature=0.0, max_new_tokens=6, prefix_len=len(system))
            for p, a in zip(prompts, adapters, strict=True)
        ]
        passes.clear()
        with torch.no_grad():
            dec.admit(rows)
        # four prefixes (one per adapter) when not cached, then ONE pass for all 8 rows
        # (32 tokens: two whole blocks of the prefix cache, all of it cached the second time)
        assert passes == ([1] * 4 if not cached else []) + [8], passes
        with torch.no_grad():
            while len(dec):
                dec.step()
        alone = [_decode(engine, [p], [a])[0][:6] for p, a in zip(prompts, adapters, strict=True)]
        assert [r.toks for r in rows] == alone
