"""`agentrl bench structured` compares the same prompts decoded under a schema and free, one
after the other on one engine. The engine keeps a finished row's K/V for the conversation's
next turn, so the second side found the first side's prompts prefilled and the benchmark
charged the whole prefill to structured outputs ("overhead" 0.354 on a quiet host, 0.017
once each side prefilled its own prompts). Each side must run its own prefill."""

from __future__ import annotations

import random
from typing import Any

from agentrl.bench.structured import _decode, _request, random_schema


async def test_each_side_prefills_its_own_prompts(engine: Any) -> None:
    schema = random_schema(random.Random(0))
    stats = engine.stats.decode
    before = stats.prefill_tokens
    constrained, _ = await _decode(engine, [_request(schema, True, 8)])
    first = stats.prefill_tokens - before
    before, cached = stats.prefill_tokens, stats.cached_tokens
    free, _ = await _decode(engine, [_request(schema, False, 8)])
    assert first > 0
    assert stats.prefill_tokens - before == first  # the same prompt, prefilled again
    assert stats.cached_tokens == cached  # nothing of it taken from the first side
    assert constrained[0].constrained and not free[0].constrained
