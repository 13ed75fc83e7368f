"""The shared decode core (`agentrl.serving.decoding`) and the local engine's continuous batching:
rows that end leave the batch, rows that join mid-decode, and the prefix KV cache all give the
tokens a row decoded alone gets (greedy, tiny random model, real forward passes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.serving.decoding import BatchDecoder, DecodeRow, PrefixCache, decode_all
from agentrl.serving.openai_types import ChatRequest
from agentrl.serving.prefix_cache import BLOCK
from deploy_helpers import write_checkpoint


def _decoder(engine: Any, cache: PrefixCache | None = None) -> BatchDecoder:
    return BatchDecoder(
        engine._forward,
        eos_ids=set(),  # the random model would stop anywhere: run every row to its limit
        pad_id=engine.pad_id,
        generator=torch.Generator().manual_seed(0),
        prefix_cache=cache,
    )


def _row(prompt: list[int], limit: int, prefix: int = 0, adapter: str = "__base__") -> DecodeRow:
    return DecodeRow(
        list(prompt), adapter=adapter, temperature=0.0, max_new_tokens=limit, prefix_len=prefix
    )


def _alone(engine: Any, prompt: list[int], limit: int, adapter: str = "__base__") -> list[int]:
    with torch.no_grad():
        return decode_all(_decoder(engine), [_row(prompt, limit, adapter=adapter)])[0].toks


def _prompts(n: int, length: int, shared: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    head = torch.randint(5, 400, (shared,), generator=g).tolist()
    return [head + torch.randint(5, 400, (length + 3 * i,), generator=g).tolist() for i in range(n)]


def test_finished_rows_leave_and_batched_greedy_equals_one_at_a_time(engine: Any) -> None:
    prompts = _prompts(3, 9)
    limits = [3, 8, 20]
    dec = _decoder(engine)
    rows = [_row(p, k) for p, k in zip(prompts, limits, strict=True)]
    sizes = []
    with torch.no_grad():
        dec.admit(rows)
        while len(dec):
            sizes.append(len(dec))
            dec.step()
    # the batch shrinks as rows end: 3 rows for 3 steps, 2 until 8, then 1 (not 3 x 20)
    assert sizes == [3] * 3 + [2] * 5 + [1] * 12
    # one forward pass after each sample but the last: 3 rows x 2, 2 rows x 5, 1 row x 12
    assert dec.stats.decode_steps == 19 and dec.stats.decode_rows == 3 * 2 + 2 * 5 + 1 * 12
    for r, p, k in zip(rows, prompts, limits, strict=True):
        assert len(r.toks) == k and r.finish == "length"
        assert r.toks == _alone(engine, p, k)


def test_rows_joining_mid_decode_get_the_tokens_they_get_alone(engine: Any) -> None:
    short, long_, mid = _prompts(3, 5)[0], _prompts(1, 40)[0], _prompts(2, 12)[1]
    dec = _decoder(engine)
    a = _row(short, 12)
    b = _row(long_, 6)  # longer than the batch so far: the batch's cache is padded
    c = _row(mid, 5)  # shorter: the newcomer's cache is padded
    with torch.no_grad():
        dec.admit([a])
        for _ in range(4):
            dec.step()
        dec.admit([b, c])
        assert len(dec) == 3
        while len(dec):
            dec.step()
    assert a.toks == _alone(engine, short, 12)
    assert b.toks == _alone(engine, long_, 6)
    assert c.toks == _alone(engine, mid, 5)


def test_the_prefix_cache_gives_the_tokens_of_no_cache_and_is_hit(engine: Any) -> None:
    shared = 2 * BLOCK + 5  # two whole blocks are kept; the 5 tokens after are prefilled
    prompts = _prompts(3, 6, shared=shared)
    cache = PrefixCache(2**30)
    with torch.no_grad():
        cached = decode_all(_decoder(engine, cache), [_row(p, 10, prefix=shared) for p in prompts])
        assert cache.misses == 1 and len(cache) == 2  # the prefix was prefilled once
        again = _decoder(engine, cache)
        decode_all(again, [_row(prompts[0], 10, prefix=shared)])
    assert cache.hits == 1 and again.stats.cached_tokens == 2 * BLOCK
    assert again.stats.prefill_tokens == len(prompts[0]) - 2 * BLOCK  # the rest only
    for r, p in zip(cached, prompts, strict=True):
        assert r.toks == _alone(engine, p, 10)
    cache.drop_adapter("__base__")
    assert len(cache) == 0 and cache.bytes == 0


def test_a_finished_conversation_is_the_next_turn_s_prefix(engine: Any) -> None:
    """An agent's next prompt starts with its last prompt and reply: only the new tokens are
    prefilled, and the answer is the one a fresh prefill gives."""
    first = _prompts(1, 2 * BLOCK + 10)[0]
    cache = PrefixCache(2**30)

    def conv() -> BatchDecoder:
        return BatchDecoder(
            engine._forward,
            eos_ids=set(),
            pad_id=engine.pad_id,
            generator=torch.Generator().manual_seed(0),
            prefix_cache=cache,
            conversations=True,
        )

    with torch.no_grad():
        turn1 = decode_all(conv(), [_row(first, 6)])[0]
        nxt = [*first, *turn1.toks, 11, 12, 13, 14]  # the reply, then the tool's result
        second = conv()
        turn2 = decode_all(second, [_row(nxt, 6)])[0]
    # the whole blocks of the prompt and the reply (whose last token was never run)
    run = (len(first) + 5) // BLOCK * BLOCK
    assert second.stats.cached_tokens == run == 2 * BLOCK
    assert second.stats.prefill_tokens == len(nxt) - run
    assert turn2.toks == _alone(engine, nxt, 6)


def test_a_tiny_budget_caches_nothing_and_changes_nothing(engine: Any) -> None:
    prompts = _prompts(2, 6, shared=30)
    cache = PrefixCache(1000)  # smaller than one prefix's K/V
    with torch.no_grad():
        rows = decode_all(_decoder(engine, cache), [_row(p, 6, prefix=30) for p in prompts])
    assert len(cache) == 0
    assert [r.toks for r in rows] == [_alone(engine, p, 6) for p in prompts]


def test_mixed_adapters_in_one_batch(engine: Any, checkpoints: list[str]) -> None:
    engine.load_adapter("dec-a", Path(checkpoints[0]))
    try:
        name = engine.adapters["dec-a"]
        prompts = _prompts(2, 10)
        with torch.no_grad():
            rows = decode_all(
                _decoder(engine), [_row(prompts[0], 8, adapter=name), _row(prompts[1], 8)]
            )
        assert rows[0].toks == _alone(engine, prompts[0], 8, adapter=name)
        assert rows[1].toks == _alone(engine, prompts[1], 8)
    finally:
        engine.unload_adapter("dec-a")


async def test_engine_answers_a_short_request_while_a_long_one_decodes(engine: Any) -> None:
    """Continuous batching: a request that arrives while another decodes joins the batch and
    is answered when it ends, not when the long one does."""
    msgs = [{"role": "system", "content": "You are a helpful agent. " * 8}]
    long_req = ChatRequest(
        model="m",
        messages=[*msgs, {"role": "user", "content": "a"}],
        max_tokens=400,
        temperature=0.0,
        stop=["\u2603\u2603"],
    )
    short_req = ChatRequest(
        model="m",
        messages=[*msgs, {"role": "user", "content": "b"}],
        max_tokens=3,
        temperature=0.0,
    )
    batches_before = len(engine.stats.batch_sizes)
    long_task = asyncio.create_task(engine.generate(None, long_req))
    while engine.stats.active == 0:  # the long one is decoding
        await asyncio.sleep(0.005)
    started = time.perf_counter()
    short = await engine.generate(None, short_req)
    short_s = time.perf_counter() - started
    assert not long_task.done(), "the short request waited for the long one"
    long_gen = await long_task
    assert short.completion_tokens == 3 and long_gen.completion_tokens == 400
    assert 2 in engine.stats.batch_sizes[batches_before:]  # they decoded together
    # and each got the tokens it gets alone
    alone = await engine.generate(None, short_req)
    assert alone.completion_token_ids == short.completion_token_ids
    assert short_s < 60


async def test_engine_caches_the_system_prompt_per_adapter(engine: Any, tmp_path: Path) -> None:
    msgs = [
        {"role": "system", "content": "You are Agent Zero. Use tools. " * 6},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    req = ChatRequest(model="m", messages=msgs, max_tokens=4, temperature=0.0)
    _, ids, system_len = engine._prompt_parts(req)
    assert 16 <= system_len < len(ids)
    # an adapter of its own: versions of identical weights would share the blocks
    engine.load_adapter("dec-b", Path(write_checkpoint(tmp_path / "dec-b", seed=103)))
    try:
        name = engine.adapters["dec-b"]
        first = await engine.generate("dec-b", req)
        hits = engine.prefixes.hits
        cached = engine.stats.decode.cached_tokens
        other = ChatRequest(
            model="m", messages=[msgs[0], {"role": "user", "content": "And 4 * 4?"}], max_tokens=4
        )
        await engine.generate("dec-b", other)
        assert engine.prefixes.hits > hits
        # at least the system prompt's whole blocks came from the cache
        assert engine.stats.decode.cached_tokens >= cached + system_len // BLOCK * BLOCK
        before = engine.stats.decode.prefill_tokens
        again = await engine.generate("dec-b", req)  # from the cache: the same tokens
        assert again.completion_token_ids == first.completion_token_ids
        # the first request's conversation held all of this prompt's whole blocks
        run = (len(ids) - 1) // BLOCK * BLOCK  # a row keeps one token of its own
        assert engine.stats.decode.prefill_tokens - before == len(ids) - run
        key = engine.weights_of(name)
        assert key.startswith("lora:") and key in engine.prefixes.weight_keys()
    finally:
        engine.unload_adapter("dec-b")
    assert key not in engine.prefixes.weight_keys()  # dropped with it
