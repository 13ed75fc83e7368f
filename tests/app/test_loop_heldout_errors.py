"""A held-out episode that ended on an error measured nothing: it is counted apart, never as
a failure of the version (a lineage's base, unloaded, read 0/50 from fifty 404s)."""

from __future__ import annotations

from agentrl.app.loop_agents import Agents
from agentrl.app.loop_config import LoopConfig
from agentrl.bus.server import free_port


async def test_episodes_that_end_on_an_error_are_left_out_and_counted() -> None:
    said: list[str] = []
    nowhere = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: every request fails
    agents = Agents(LoopConfig.quick(), None, nowhere, "p", said.append)
    try:
        tasks = [("frozenlake", 1_000_000 + k) for k in range(3)]
        wins, n, per = await agents.heldout("p-base", tasks)
    finally:
        await agents.close()
    assert (wins, n, per) == (0, 0, {})
    assert agents.heldout_errors == {"p-base": 3}
    assert said == ["held-out p-base: 3 episodes ended on an error (left out)"]
