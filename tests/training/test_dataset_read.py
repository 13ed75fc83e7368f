"""`read_subject` through batched pull requests gives what nats-py's ordered consumer gives:
every message of the subject (not of the stream's other subjects) in stream order, over
several pull batches, none published after the call, and leaves no consumer behind."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import nats as nats_client
from nats.js.api import StreamConfig

from agentrl.training import dataset
from agentrl.training.dataset import _read_ordered, read_subject


async def test_pulled_read_equals_the_ordered_consumer(nats):
    nc = await nats_client.connect(nats.url)
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name="READ", subjects=["read.>"]))
        n = dataset.PULL_BATCH * 2 + 357  # more than the two batches in flight
        for i in range(n):
            await js.publish("read.a", b'{"i": %d}' % i)
            if i % 3 == 0:
                await js.publish("read.b", b"other %d" % i)
        t0 = time.monotonic()
        got = await read_subject(js, "READ", "read.a")
        assert time.monotonic() - t0 < 1.5  # ended at the last message, not at an idle timeout
        assert got == [b'{"i": %d}' % i for i in range(n)]
        assert len(await read_subject(js, "READ", "read.b")) == len(range(0, n, 3))
        assert (await js.stream_info("READ")).state.consumer_count == 0
        assert got == await _read_ordered(js, "READ", "read.a", None, 2.0)
        await js.publish("read.a", b"late")
        assert (await read_subject(js, "READ", "read.a"))[-1] == b"late"
        future = datetime(2099, 1, 1, tzinfo=UTC)
        assert await read_subject(js, "READ", "read.a", future, idle_timeout=0.3) == []
        past = datetime(2000, 1, 1, tzinfo=UTC)
        assert len(await read_subject(js, "READ", "read.a", past)) == n + 1
        assert await read_subject(js, "READ", "read.nothing") == []
    finally:
        await nc.close()
