"""`open_bucket` through a lost request: a JetStream API request sent while a cluster
elects its meta leader is never answered. Here a real server is reached through a TCP
path cut for a moment (the request is dropped, the client sees only silence)."""

from __future__ import annotations

import asyncio
import uuid

from nats.js.api import KeyValueConfig

from agentrl.bus import Bus
from agentrl.bus.kv import open_bucket
from tcp_proxy import TcpProxy


async def test_a_lost_request_does_not_hold_the_open_for_the_callers_whole_timeout(
    nats_url: str,
) -> None:
    """The first create went into the cut; the next try follows within seconds of the path
    healing, not after the caller's timeout (30 s here; 5 s in services, where a reward
    service started during a fail-over waited it out past the cluster's return)."""
    host, port = nats_url.rsplit("//", 1)[1].split(":")
    proxy = await TcpProxy(host, int(port)).start()
    bus = await Bus.connect(proxy.url)
    try:
        patient = bus.nc.jetstream(timeout=30.0)
        name = f"open_{uuid.uuid4().hex[:8]}"
        proxy.cut()
        task = asyncio.create_task(open_bucket(patient, KeyValueConfig(bucket=name, history=1)))
        await asyncio.sleep(1.5)
        assert not task.done()  # nothing answered through the cut
        assert proxy.dropped > 0  # its request went into it
        proxy.heal()
        kv = await asyncio.wait_for(task, 25)  # the caller's own timeout would be 30 s
        assert kv._js is patient  # the bucket keeps the caller's context and timeout
        await kv.put("k", b"v")
        assert (await kv.get("k")).value == b"v"
        await bus.js.delete_key_value(name)
    finally:
        await bus.close()
        await proxy.close()
