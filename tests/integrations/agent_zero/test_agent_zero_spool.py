"""NATS unreachable: the spool takes the events and each monologue waits a bounded time; a
nats-server started later on the same port gets every event once, in order."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from a0_kit import Checkout, recording, stream_payloads
from a0_standins import install_standins, make_checkout, remove_standins

from agentrl.bus.server import EmbeddedNats, free_port
from agentrl.contracts import TrajectoryEvent
from agentrl.integrations.agent_zero import hooks, state
from agentrl.integrations.agent_zero.publisher import Outbox


async def test_nats_down_then_up_every_event_once_in_order(tmp_path: Path) -> None:
    port = free_port()
    root = make_checkout(tmp_path / "agent-zero")
    install_standins(root)
    server = None
    try:
        co = Checkout(
            root, f"nats://127.0.0.1:{port}", publish_timeout_s=1.0, connect_timeout_s=0.5
        )
        rec = recording("main_with_tools")
        agents = []
        for _ in range(3):
            t0 = time.perf_counter()
            agent, answer = await co.run(rec)
            took = time.perf_counter() - t0
            assert answer is not None
            # a refused connection is found out by the TCP probe: the agent barely waits
            assert took < 1.0, took
            agents.append(agent)
        spooled = sorted(co.spool_dir.glob("*.event"))
        assert len(spooled) == 3

        server = EmbeddedNats(data_dir=tmp_path / "nats", port=port)
        server.start()
        # the next monologue's start flushes the spool (the fallback flush), its end adds its own
        late, _ = await co.run(rec)
        agents.append(late)
        got = await stream_payloads(server.url, TrajectoryEvent.SUBJECT)
        assert [g["session_id"] for g in got] == [a.context.id for a in agents]
        assert len({g["trajectory_id"] for g in got}) == 4
        assert not list(co.spool_dir.glob("*.event"))

        # a crash between PubAck and delete spools an event again: Msg-Id drops the copy
        again = TrajectoryEvent.model_validate(got[0])
        outbox = Outbox(hooks.config_for(co.plugin_dir / "plugin.yaml"))
        outbox.spool.put(again)
        assert await outbox.flush() == 1
        assert len(await stream_payloads(server.url, TrajectoryEvent.SUBJECT)) == 4
    finally:
        if server is not None:
            server.stop()
        remove_standins(root)
        state.reset_caches()


async def test_unreadable_spool_file_is_set_aside(tmp_path: Path, a0_nats: Any) -> None:
    from agentrl.integrations.agent_zero.spool import Spool

    spool = Spool(tmp_path / "spool")
    spool.put_raw("agent.rl.feedback.v1", "x", b"{}")
    (tmp_path / "spool" / "00000000000000000000-0000000-00000000.event").write_bytes(b"garbage")
    items = spool.pending()
    assert [i.msg_id for i in items] == ["x"]
    assert len(list((tmp_path / "spool").glob("*.bad"))) == 1


async def test_a_silent_nats_costs_one_budget_then_flushes_pause(tmp_path: Path) -> None:
    """A server that accepts TCP but never answers: one monologue waits the budget, the next
    ones only spool (flushes pause, 5 s doubling to 60 s); `flush(force=True)` still tries."""
    import asyncio

    held = []

    def hold(reader: Any, writer: Any) -> None:  # accept, never speak NATS
        held.append(writer)

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    root = make_checkout(tmp_path / "agent-zero")
    install_standins(root)
    try:
        co = Checkout(
            root, f"nats://127.0.0.1:{port}", publish_timeout_s=0.5, connect_timeout_s=0.5
        )
        rec = recording("main_with_tools")
        took, tries = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            await co.run(rec)
            took.append(time.perf_counter() - t0)
            tries.append(len(held))  # connections the silent server accepted so far
        assert 0.4 < took[0] < 1.5, took  # the first end waited its budget
        assert tries[0] >= 1 and tries[1:] == [tries[0]] * 2, tries  # then only the spool
        assert max(took[1:]) < 0.5, took  # no new connection, no second wait of the budget
        assert len(list(co.spool_dir.glob("*.event"))) == 3
        outbox = hooks.outbox_for(hooks.config_for(co.plugin_dir / "plugin.yaml"))
        assert outbox.pause_s == 5.0 and await outbox.flush() == 0
        t0 = time.perf_counter()
        assert await outbox.flush(force=True) == 0
        assert time.perf_counter() - t0 >= 0.4 and outbox.pause_s == 10.0
    finally:
        silent.close()
        for w in held:
            w.close()
        remove_standins(root)
        state.reset_caches()
