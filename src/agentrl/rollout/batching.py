"""Micro-batching of concurrent requests: the policy and the gateway's local backend both
serve many callers with one batched forward pass."""

from __future__ import annotations

import asyncio
from typing import TypeVar

T = TypeVar("T")


async def next_batch(queue: asyncio.Queue[T], max_size: int, max_wait_s: float) -> list[T]:
    """Take what is queued (at least one item: call only when the queue is not empty), then
    wait up to `max_wait_s` for more, up to `max_size` items."""
    loop = asyncio.get_running_loop()
    batch = [queue.get_nowait()]
    deadline = loop.time() + max_wait_s
    while len(batch) < max_size:
        if not queue.empty():
            batch.append(queue.get_nowait())
            continue
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            batch.append(await asyncio.wait_for(queue.get(), remaining))
        except TimeoutError:
            break
    return batch
