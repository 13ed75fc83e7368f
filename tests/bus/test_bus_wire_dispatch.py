"""The lean message dispatch of the bus's own subscriptions (`wire.subscribe`): headers are
parsed exactly as nats-py parses them, and status lines still take nats-py's own path."""

from __future__ import annotations

import asyncio

import nats.errors
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from agentrl.bus import Bus, wire

_NAME = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters=":"), max_size=12
)
_VALUE = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"), max_size=20)


@settings(max_examples=100, deadline=None)
@given(
    lines=st.lists(st.tuples(_NAME, st.sampled_from([":", ": ", ":\t", ""]), _VALUE), max_size=5)
)
def test_header_lines_parse_as_nats_py_does(lines: list[tuple[str, str, str]]) -> None:
    block = b"NATS/1.0\r\n" + b"".join(f"{n}{s}{v}\r\n".encode() for n, s, v in lines) + b"\r\n"
    assert wire._header_lines(block) == (Client._parse_header_lines(block[10:]) or None)


async def test_lean_dispatch_delivers_headers_and_status_lines(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    try:
        sub = await wire.subscribe(bus.nc, "agentrl.test.dispatch")
        await bus.nc.publish(
            "agentrl.test.dispatch", b"x", headers={"Nats-Msg-Id": "m-1", "K": "v w"}
        )
        await bus.nc.publish("agentrl.test.dispatch", b"y")
        # a request nobody answers comes back as a "NATS/1.0 503" status line
        await bus.nc.publish("agentrl.test.nobody", b"", reply="agentrl.test.dispatch")
        got = [await asyncio.wait_for(sub._pending_queue.get(), 5) for _ in range(3)]
        assert got[0].data == b"x" and got[0].headers == {"Nats-Msg-Id": "m-1", "K": "v w"}
        assert got[1].data == b"y" and got[1].headers is None
        assert (got[2].headers or {}).get("Status") == "503"
        assert sub._pending_size == len(b"x") + len(b"y")
        await sub.unsubscribe()  # no callback drains it: closing would wait for the queue
    finally:
        await bus.close()


async def test_sink_gets_raw_messages_and_publisher_maps_each_answer(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    got: list[tuple[bytes, bytes, bytes | None]] = []
    try:
        sub = await wire.subscribe(bus.nc, "agentrl.test.sink", sink=lambda *m: got.append(m))
        await bus.nc.publish("agentrl.test.sink", b"x", headers={"K": "v"})
        await bus.nc.publish("agentrl.test.nobody", b"", reply="agentrl.test.sink")
        await bus.nc.flush()
        for _ in range(50):
            if len(got) == 2:
                break
            await asyncio.sleep(0.02)
        assert got[0][:2] == (b"agentrl.test.sink", b"x") and got[0][2] is not None
        assert wire._header_lines(got[0][2]) == {"K": "v"}
        assert got[1][1] == b"" and (got[1][2] or b"").startswith(b"NATS/1.0 503")
        await sub.unsubscribe()
        # PubAcks through the sink: stored, duplicate (same Msg-Id), and no stream at all
        await bus.ensure_streams()
        pub = wire.AsyncPublisher(bus.nc, window=8)
        items = [
            ("agent.rl.dlq.sink-test", b"{}", "sink-1"),
            ("agent.rl.dlq.sink-test", b"{}", "sink-1"),
            ("agentrl.test.no-stream-here", b"{}", "sink-2"),
        ]
        results = await pub.publish(len(items), items.__getitem__, timeout=5)
        assert results[0].stream == "RL_DLQ" and not results[0].duplicate  # type: ignore[union-attr]
        assert results[1].duplicate and results[1].seq == results[0].seq  # type: ignore[union-attr]
        assert isinstance(results[2], nats.errors.NoRespondersError)
        await pub.close()
        await bus.js.purge_stream("RL_DLQ", subject="agent.rl.dlq.sink-test")  # leave no trace
    finally:
        await bus.close()
