"""The shared reward records (NATS KV, real server): create-only and compare-and-set."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from agentrl.bus import Bus, EmbeddedNats
from agentrl.rewards.claims import Claims, key_for


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    srv = EmbeddedNats(data_dir=tmp_path_factory.mktemp("claims-nats"))
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("fast", [True, False], ids=["wire", "nats-py"])
async def test_create_many_creates_once_and_answers_the_existing_record(
    server: EmbeddedNats, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not fast:  # the path for a nats-py without the internals the wire frames need
        monkeypatch.setattr("agentrl.rewards.claims.wire.supported", lambda nc: False)
    bus = await Bus.connect(server.url)
    durable = f"t-{uuid.uuid4().hex[:6]}"
    a = await Claims.open(bus.nc, bus.js, durable, replica="a")
    b = await Claims.open(bus.nc, bus.js, durable, replica="b")  # another replica
    ids = [str(uuid.uuid4()) for _ in range(300)] + ["not a key: ünïcode/.."]
    first = await a.create_many([(t, a.scored(b'{"x":1}', {}, 1, 1.0)) for t in ids])
    assert first == [None] * len(ids)
    again = await b.create_many([(t, b.scored(b'{"x":2}', {}, 1, 2.0)) for t in ids])
    assert all(
        r is not None and r.data["by"] == "a" and r.data["reward"] == {"x": 1} for r in again
    )
    rec = again[0]
    assert rec is not None
    assert await b.update(ids[0], b.scored(b'{"x":3}', {}, 2, 3.0), rec.revision) is not None
    # a stale revision loses: exactly one writer per version
    assert await a.update(ids[0], a.scored(b'{"x":4}', {}, 2, 4.0), rec.revision) is None
    now = await a.get(ids[0])
    assert now is not None and now.version == 2 and now.data["by"] == "b"
    assert key_for("not a key: ünïcode/..").startswith("sha256_")
    await bus.close()


async def test_creates_lost_on_the_way_are_written_again_not_waited_out(
    server: EmbeddedNats,
) -> None:
    """A batch of creates written into a path that drops them (as to a SIGKILLed stream
    leader) is written again after `stall_s` of silence once the path is back, and each
    record is created once; it used to wait the batch's whole timeout (30 s here, 10 s in
    the service, where the batch then failed and its trajectories were nakked)."""
    import asyncio

    from tcp_proxy import TcpProxy

    host, port = server.url.rsplit("//", 1)[1].split(":")
    proxy = await TcpProxy(host, int(port)).start()
    bus = await Bus.connect(proxy.url)
    try:
        durable = f"t-{uuid.uuid4().hex[:6]}"
        a = await Claims.open(bus.nc, bus.js, durable, replica="a")
        a.timeout = 30.0
        await a.create_many([("warm", a.scored(b"{}", {}, 1, 1.0))])  # its inbox exists
        ids = [str(uuid.uuid4()) for _ in range(50)]
        proxy.cut()
        task = asyncio.create_task(a.create_many([(t, a.scored(b"{}", {}, 1, 1.0)) for t in ids]))
        await asyncio.sleep(0.5)
        assert not task.done() and proxy.dropped > 0  # the creates went into the cut
        proxy.heal()
        assert await asyncio.wait_for(task, 20) == [None] * len(ids)  # all created here
        again = await a.create_many([(t, a.scored(b"{}", {}, 2, 2.0)) for t in ids])
        assert all(r is not None and r.version == 1 and r.data["by"] == "a" for r in again)
    finally:
        await bus.close()
        await proxy.close()
