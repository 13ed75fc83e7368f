"""Issue 29.11: the local backend's prompt caches are LRUs bounded by bytes (digest keys,
token ids as array('i')), and the completion log's queue while NATS is away is bounded by
bytes (the oldest records dropped and counted), never unbounded."""

from __future__ import annotations

import asyncio
from array import array
from typing import Any

from agentrl.bus import Bus
from agentrl.contracts.base import utcnow
from agentrl.contracts.completion import CompletionRecord
from agentrl.serving.gateway import CompletionLog
from agentrl.serving.local import LocalEngine
from agentrl.serving.lru import ByteLRU
from agentrl.serving.openai_types import ChatRequest
from deploy_helpers import TINY


def conversation(i: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [{"role": "system", "content": f"You are agent {i}."}]
    for t in range(10):
        turns.append({"role": "user", "content": f"Step {t} of task {i}: the tool said ok. " * 4})
        turns.append({"role": "assistant", "content": f'{{"tool": "shell", "arg": "{i}-{t}"}}'})
    return turns


def test_byte_lru_keeps_to_its_budget_and_evicts_the_least_recent() -> None:
    cache = ByteLRU(20_000, tag_of=lambda k: k[0])
    for i in range(100):
        cache[("v1", f"prompt {i}" * 50)] = ("x" * 100, array("i", range(200)))
        assert cache.bytes <= 20_000
    assert 0 < len(cache) < 100 and cache.evictions == 100 - len(cache)
    newest = ("v1", "prompt 99" * 50)
    assert cache.get(newest) is not None and cache.get(("v1", "prompt 0" * 50)) is None
    cache[("v2", "other")] = ("y", array("i", [1, 2, 3]))
    cache.drop_tag("v1")
    assert len(cache) == 1 and cache.get(("v2", "other")) is not None
    cache["huge"] = "z" * 50_000  # larger than the whole budget: not kept
    assert cache.get("huge") is None and cache.bytes <= 20_000


async def test_engine_prompt_cache_is_bounded_by_bytes() -> None:
    budget_mb = 0.25
    engine = LocalEngine(
        "tiny", seed=0, tiny_kwargs=TINY, default_max_tokens=2, prompt_cache_mb=budget_mb
    )
    first = ChatRequest(model="x", messages=conversation(0), max_tokens=2)
    gen = await engine.generate(None, first)
    for i in range(1, 400):
        engine._prompt(ChatRequest(model="x", messages=conversation(i)))
    limit = budget_mb * 2**20
    assert engine._prompts.bytes + engine._choice_cache.bytes <= limit
    assert engine._prompts.evictions > 0 and len(engine._prompts) < 400
    last = ChatRequest(model="x", messages=conversation(399), max_tokens=2)
    _text, ids = engine._prompt(last)  # a hit: the same ids as a fresh tokenisation
    assert ids == engine.encode(last) and isinstance(ids, list)
    again = await engine.generate(None, first)  # evicted long ago: rendered again, same prompt
    assert again.prompt_token_ids == gen.prompt_token_ids


def record(i: int, n: int = 2000) -> CompletionRecord:
    return CompletionRecord(
        completion_id=f"c-{i}",
        model="m",
        prompt_token_ids=list(range(1000, 1000 + n)),
        completion_token_ids=[1, 2, 3],
        completion_logprobs=[-1.0, -1.0, -1.0],
        timestamp=utcnow(),
    )


async def test_completion_log_queue_is_bounded_by_bytes_while_nats_is_away(
    nats_url: str,
) -> None:
    budget = 1_000_000
    log = CompletionLog(None, max_bytes=budget)  # no publisher running: NATS "away"
    for i in range(200):
        log.submit(record(i))
        assert log.bytes <= budget
    kept = len(log.queue)
    assert 0 < kept < 200 and log.dropped == 200 - kept
    assert log.queue[-1].completion_id == "c-199"  # the newest are kept
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    log.bus = bus
    stop = asyncio.Event()
    task = asyncio.create_task(log.run(stop))
    try:
        for _ in range(200):
            if log.published + log.failed >= kept:
                break
            await asyncio.sleep(0.05)
        assert log.failed == 0, log.failed
        assert log.published == kept and log.bytes == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.close()
