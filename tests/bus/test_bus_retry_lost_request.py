"""`Bus._retry` through a lost request: a JetStream API request sent while a cluster elects
its meta leader is never answered. A real server is reached through a TCP path cut for a
moment (the request is dropped, the client sees only silence), as in
test_kv_open_bucket.py."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from agentrl.bus import Bus
from agentrl.contracts.streams import StreamSpec
from tcp_proxy import TcpProxy


async def test_a_lost_api_request_does_not_hold_ensure_streams_for_the_whole_timeout(
    nats_url: str,
) -> None:
    """The stream's first request went into the cut; the next try follows within seconds of
    the path healing, not after the bus's timeout (30 s here; 5 s in services, once per lost
    request)."""
    host, port = nats_url.rsplit("//", 1)[1].split(":")
    proxy = await TcpProxy(host, int(port)).start()
    bus = await Bus.connect(proxy.url, publish_timeout=30.0)
    name = f"RETRY_{uuid.uuid4().hex[:8].upper()}"
    spec = StreamSpec(name, (f"retry.{name.lower()}",), 3600, 100, 1024 * 1024)
    try:
        proxy.cut()
        started = time.monotonic()
        task = asyncio.create_task(bus.ensure_streams([spec], replicas=1))
        await asyncio.sleep(1.5)
        assert not task.done()  # nothing answered through the cut
        assert proxy.dropped > 0  # its request went into it
        proxy.heal()
        await asyncio.wait_for(task, 25)  # the bus's own timeout would be 30 s
        took = time.monotonic() - started
        assert took < 10, f"ensure_streams took {took:.1f} s after a lost request"
        info = await bus.js.stream_info(name)
        assert info.config.subjects == [f"retry.{name.lower()}"]
        await bus.js.delete_stream(name)
    finally:
        await bus.close()
        await proxy.close()


async def test_requests_lost_for_good_are_waited_for_as_long_as_before(nats_url: str) -> None:
    """Shorter tries keep the overall bound: `api_attempts` whole timeouts (2 x 2 s here)
    pass in unanswered tries before the error is raised, not fewer."""
    host, port = nats_url.rsplit("//", 1)[1].split(":")
    proxy = await TcpProxy(host, int(port)).start()
    bus = await Bus.connect(proxy.url, publish_timeout=2.0, api_attempts=2)
    try:
        proxy.cut()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await bus._retry(lambda js: js.stream_info("RL_TRAJECTORIES"))
        took = time.monotonic() - started
        assert 4.0 <= took < 9.0, f"gave up after {took:.1f} s"
        assert proxy.dropped > 0
    finally:
        await bus.nc.close()  # no drain through a cut path
        await proxy.close()
