"""The local engine's speed-ups change nothing the trainers read: the same requests (Agent
Zero's reply schema, greedy and sampled, a LoRA adapter and the base in one batch) decode to
the same tokens with the same log-probs, bit for bit, with and without them (tiny random
models, real forward passes, real llguidance masks)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.serving.decoding import BatchDecoder, DecodeRow, _cache_of, _kv_of, _pad_left
from agentrl.serving.openai_types import ChatRequest
from agentrl.serving.packed import is_packed, pack_linears, unpack_linears
from deploy_helpers import TINY


def _reply_format() -> dict[str, Any]:
    from agentrl.app.loop_tooluse import response_format

    return response_format()


def _requests(n: int, temperature: float) -> list[ChatRequest]:
    from agentrl.envs.tooluse.agent_prompt import messages_for

    return [
        ChatRequest(
            model="m",
            messages=messages_for(f"What is {17 * i + 3} times {i + 2}?"),
            temperature=temperature,
            max_tokens=24,
            response_format=_reply_format(),
        )
        for i in range(n)
    ]


def _engine(**kw: Any) -> Any:
    from agentrl.serving.local import LocalEngine

    kw.setdefault("threads", 1)  # one thread: the exact reference (two: see below)
    return LocalEngine("tiny", seed=0, tiny_kwargs=TINY, max_batch_size=8, **kw)


async def _decode(engine: Any, model_ids: list[str | None], temperature: float) -> list[Any]:
    engine._rng.manual_seed(11)
    engine.prefixes.clear()
    reqs = _requests(len(model_ids), temperature)
    return list(
        await asyncio.gather(*(engine.generate(m, r) for m, r in zip(model_ids, reqs, strict=True)))
    )


def test_packed_weights_equal_plain_linear_bit_for_bit() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(96, 256), torch.nn.Linear(256, 96, bias=False))
    x = torch.randn(3, 5, 96)
    with torch.no_grad():
        plain = model(x)
        assert pack_linears(model) == 2 and is_packed(model[0])
        packed = model(x)
        for rows in (1, 2, 16, 40):  # decode batches and a prefill
            y = torch.randn(rows, 96)
            z = model(y)
            unpack_linears(model)
            assert torch.equal(z, model(y))
            pack_linears(model)
    assert torch.equal(plain, packed)
    y = model(x)  # with gradients on: plain F.linear, gradients flow
    y.sum().backward()
    assert model[0].weight.grad is not None


@pytest.fixture(scope="module")
def engines(checkpoints: list[str]) -> tuple[Any, Any]:
    """The engine with every speed-up on (packed weights are opt-in) and the plain path,
    same base and adapter."""
    fast, plain = _engine(packed_weights=True), _engine(packed_weights=False)
    assert fast.packed_layers > 0 and plain.packed_layers == 0
    for e in (fast, plain):
        e.load_adapter("a", Path(checkpoints[0]))
    return fast, plain


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_fast_engine_logs_what_the_plain_engine_logs(
    engines: tuple[Any, Any], temperature: float
) -> None:
    """A batch mixing the adapter and the base, under the reply schema: equal tokens, equal
    log-probs (greedy; sampled from the same seed)."""
    ids: list[str | None] = ["a", None, "a", "a", None, "a"]
    fast, plain = (asyncio.run(_decode(e, ids, temperature)) for e in engines)
    for f, p in zip(fast, plain, strict=True):
        assert f.constrained and f.completion_token_ids
        assert f.completion_token_ids == p.completion_token_ids
        assert f.token_logprobs == p.token_logprobs


class _CopyingDecoder(BatchDecoder):
    """The decode core as it was: rows leaving and joining concatenate the batch's K/V (and
    the next step copies it again into a buffer with room): the reference."""

    def _select(self, keep: list[int]) -> None:
        assert self._mask is not None and self._next_pos is not None
        index = torch.tensor(keep)
        mask = self._mask[index]
        real = mask.any(0).nonzero()
        start = int(real[0]) if len(real) else 0
        kv = [(k[index, :, start:], v[index, :, start:]) for k, v in _kv_of(self._cache)]
        self._cache = _cache_of(kv)
        self._mask = mask[:, start:]
        self._next_pos = self._next_pos[index]

    def _join(self, parts: Any) -> None:  # a group at a time
        for rows, prefill in parts:
            self._join_one(rows, *prefill)

    def _join_one(self, rows: Any, cache: Any, mask: Any, next_pos: Any, logits: Any) -> None:
        if not self.rows:
            super()._join([(rows, (cache, mask, next_pos, logits))])
            return
        assert self._mask is not None and self._next_pos is not None and self._logits is not None
        old_t, new_t = self._mask.shape[1], mask.shape[1]
        width = max(old_t, new_t)
        merged = [
            (
                torch.cat([_pad_left(a.keys, width - old_t, 2), _pad_left(k, width - new_t, 2)]),
                torch.cat([_pad_left(a.values, width - old_t, 2), _pad_left(v, width - new_t, 2)]),
            )
            for a, (k, v) in zip(self._cache.layers, _kv_of(cache), strict=True)
        ]
        self._cache = _cache_of(merged)
        self._mask = torch.cat(
            [_pad_left(self._mask, width - old_t, 1), _pad_left(mask, width - new_t, 1)]
        )
        self._next_pos = torch.cat([self._next_pos, next_pos])
        self._logits = torch.cat([self._logits, logits])
        self.rows.extend(rows)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_joining_and_leaving_log_what_the_copying_core_logged(
    engines: tuple[Any, Any], temperature: float
) -> None:
    """Rows of different lengths and limits join mid-decode and leave: every row's tokens
    and log-probs equal the reference core's, bit for bit."""
    engine = engines[0]
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, 400, (n,), generator=g).tolist() for n in (9, 40, 14, 23, 5)]
    limits = [12, 6, 9, 3, 15]

    def run(cls: type[BatchDecoder]) -> list[tuple[list[int], list[float]]]:
        dec = cls(engine._forward, eos_ids=set(), pad_id=engine.pad_id,
                  generator=torch.Generator().manual_seed(1))  # fmt: skip
        rows = [
            DecodeRow(list(p), temperature=temperature, max_new_tokens=k)
            for p, k in zip(prompts, limits, strict=True)
        ]
        with torch.no_grad():
            dec.admit(rows[:2])
            for _ in range(2):
                dec.step()
            dec.admit(rows[2:4])  # one shorter, one longer than the batch so far
            for _ in range(4):
                dec.step()
            dec.admit(rows[4:])
            while len(dec):
                dec.step()
        return [(r.toks, r.lps) for r in rows]

    assert run(BatchDecoder) == run(_CopyingDecoder)


def _grammar_rows(engine: Any, temperature: float, n: int = 5) -> list[DecodeRow]:
    """Agent Zero replies as the engine queues them: the chat prompt, the reply schema's
    matcher (its own copy each), a token limit."""
    from agentrl.serving.structured import constraint_for

    rows = []
    for req in _requests(n, temperature):
        _, ids, _ = engine._prompt_parts(req)
        constraint = constraint_for(req)
        assert constraint is not None
        matcher = asyncio.run(engine.grammars.matcher(constraint))
        rows.append(DecodeRow(ids, temperature=temperature, max_new_tokens=60, matcher=matcher))
    return rows


def _run_rows(
    engine: Any, rows: list[DecodeRow], fast_forward: bool, select_logits: bool = False
) -> list[DecodeRow]:
    dec = BatchDecoder(engine._forward, eos_ids=engine.eos_ids, pad_id=engine.pad_id,
                       generator=torch.Generator().manual_seed(2), fast_forward=fast_forward,
                       select_logits=select_logits)  # fmt: skip
    with torch.no_grad():
        dec.admit(rows[:3])
        dec.step()
        dec.admit(rows[3:])  # joining a batch whose K/V has forced runs' masked columns
        while len(dec):
            dec.step()
    assert (dec.stats.forced_tokens > 0) == fast_forward
    return rows


def test_forced_tokens_log_what_the_token_by_token_path_logs(engines: tuple[Any, Any]) -> None:
    """Greedy replies under the reply schema: the tokens the grammar forces, taken without a
    decode step each, give the same tokens, log-prob 0 where forced, and log-probs within
    1e-5 elsewhere (the forward passes see masked columns between a row's tokens)."""
    engine = engines[0]
    fast = _run_rows(engine, _grammar_rows(engine, 0.0), fast_forward=True)
    slow = _run_rows(engine, _grammar_rows(engine, 0.0), fast_forward=False)
    for f, s in zip(fast, slow, strict=True):
        assert f.toks == s.toks and f.finish == s.finish
        assert len(f.toks) > 10
        for a, b in zip(f.lps, s.lps, strict=True):
            assert abs(a - b) <= 1e-5
            assert (a == 0.0) == (b == 0.0)
    assert sum(lp == 0.0 for r in slow for lp in r.lps) > 10  # forced tokens were there


def test_sampled_replies_with_forced_tokens_stay_in_the_grammar(engines: tuple[Any, Any]) -> None:
    """At temperature 1 the replies differ from the token-by-token path's (fewer steps draw
    fewer random numbers) but each is one the grammar allows, forced tokens logged at 0."""
    import json

    import jsonschema_rs

    from agentrl.envs.tooluse.agent_prompt import response_schema

    engine = engines[0]
    for r in _run_rows(engine, _grammar_rows(engine, 1.0, n=6), fast_forward=True):
        assert r.finish in ("stop", "length")
        if r.finish == "stop":
            reply = json.loads(engine.tokenizer.decode(r.toks))
            assert jsonschema_rs.is_valid(response_schema(), reply), reply


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_whose_next_token_is_forced_skip_the_vocabulary_projection(
    engines: tuple[Any, Any], temperature: float
) -> None:
    """The vocabulary projection only for rows whose next token the grammar does not force:
    the same tokens (sampled too: the same random numbers are drawn), log-prob 0 where
    forced, the other log-probs within 1e-5 (the projection of fewer rows)."""
    engine = engines[0]
    calls: list[int] = []
    head = engine.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _o: calls.append(args[0].shape[0]))
    try:
        sel = _run_rows(engine, _grammar_rows(engine, temperature), False, select_logits=True)
        projected, calls[:] = sum(calls), []
        full = _run_rows(engine, _grammar_rows(engine, temperature), False)
    finally:
        hook.remove()
    assert projected < sum(calls)  # fewer rows projected
    for a, b in zip(sel, full, strict=True):
        assert a.toks == b.toks and a.finish == b.finish
        for x, y in zip(a.lps, b.lps, strict=True):
            assert abs(x - y) <= 1e-5 and (x == 0.0) == (y == 0.0)
