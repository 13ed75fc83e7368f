"""The deployment service's start-up registry calls wait for NATS (issue 49, found in the
replica soak): a replica started beside a cluster still electing the bucket's leader got
`nats: timeout` from the registry in `bootstrap`, died, and nothing outside `agentrl up`
restarted it. Here a real registry is read through a TCP path cut for a while."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from agentrl.bus import Bus
from agentrl.release.service import _at_start_up
from agentrl.serving.registry import Registry
from tcp_proxy import TcpProxy


async def test_a_start_up_registry_call_waits_for_nats_instead_of_dying(nats_url: str) -> None:
    host, port = nats_url.rsplit("//", 1)[1].split(":")
    proxy = await TcpProxy(host, int(port)).start()
    bus = await Bus.connect(proxy.url)
    try:
        # JetStream calls that give up after 2 s, not nats-py's 5: the same retries, sooner
        registry = await Registry.open(bus.nc.jetstream(timeout=2.0), bucket="startup_retry")
        assert (await registry.get_split("p"))[0] is None
        proxy.cut()
        with pytest.raises(nats.errors.TimeoutError):  # what killed the replica
            await _get(registry)
        stop = asyncio.Event()
        seen: list[object] = []
        attempts = 0

        async def read() -> None:
            nonlocal attempts
            attempts += 1
            seen.append(await registry.get_split("p"))

        waiting = asyncio.create_task(_at_start_up(read, stop, patience_s=60))
        for _ in range(300):  # the first attempt timed out and a second one began
            if attempts >= 2:
                break
            await asyncio.sleep(0.1)
        assert attempts >= 2 and not waiting.done()  # retrying, not dead
        proxy.heal()
        await asyncio.wait_for(waiting, 45)
        assert seen == [(None, 0)]
    finally:
        await bus.close()
        await proxy.close()


async def _get(registry: Registry) -> object:
    return await registry.kv.get("split.p")


async def test_start_up_gives_up_when_asked_to_stop() -> None:
    stop = asyncio.Event()
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        raise nats.errors.TimeoutError

    stop.set()
    with pytest.raises(nats.errors.TimeoutError):
        await _at_start_up(flaky, stop, patience_s=60)
    assert calls == 1
