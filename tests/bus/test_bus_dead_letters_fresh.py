"""Reading the dead letters of a stack that never dead-lettered anything returns nothing."""

from __future__ import annotations

from pathlib import Path

from agentrl.bus import Bus, EmbeddedNats


async def test_dead_letters_of_a_fresh_stream_is_empty(tmp_path: Path) -> None:
    with EmbeddedNats(data_dir=tmp_path) as server:
        bus = await Bus.connect(server.url)
        try:
            await bus.ensure_streams()
            assert await bus.dead_letters() == []
        finally:
            await bus.close()
