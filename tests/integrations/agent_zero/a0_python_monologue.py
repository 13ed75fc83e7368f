"""Run by Agent Zero's own Python (a venv holding agentrl-a0-client and nothing of this
checkout): one recorded monologue through the plugin installed in an Agent Zero folder, then
what it published, read back from NATS. Prints one JSON line for the caller to check.

`python a0_python_monologue.py AGENT_ZERO_ROOT SESSION NATS_URL`. Two callers, one install
each: test_agent_zero_client.py (pytest alone) and clients/agentrl-a0-client/follow_guide.py
(scripts/test.sh's Python 3.12 step, the plugin the guide's lines installed, publishing to
`agentrl up`'s NATS). The folder gets the stand-in helpers (a0_standins.py) first.
Standard library, the client and its dependencies (nats-py) only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RECORDING = HERE / "data" / "main_with_tools.json"


async def trajectories_of(url: str, session: str, idle: float = 1.0) -> list[dict[str, Any]]:
    """The session's trajectory payloads stored on the bus, in stream order."""
    import nats

    nc = await nats.connect(url)
    try:
        sub = await nc.jetstream().subscribe("agent.rl.trajectory.v1", ordered_consumer=True)
        out = []
        while True:
            try:
                msg = await sub.next_msg(timeout=idle)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            payload = json.loads(msg.data)
            if payload.get("session_id") == session:
                out.append(payload)
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


def main(argv: list[str]) -> int:
    root, session, nats_url = Path(argv[1]), argv[2], argv[3]
    sys.path.insert(0, str(root))  # the folder's helpers package, as Agent Zero runs
    from a0_standins import Agent, Config, Context, Driver, Extensions, Message, make_checkout

    make_checkout(root)
    rec = json.loads(RECORDING.read_text())
    ext = Extensions([root / "usr" / "plugins" / "agentrl" / "extensions" / "python"])
    agent = Agent(0, Config("agent0"), Context(session))
    agent.last_user_message = Message(rec["user_message"]["content"], "m-1")
    answer = asyncio.run(Driver(ext).monologue(agent, rec["iterations"]))
    import agentrl.integrations.agent_zero.hooks as hooks
    from agentrl.integrations.agent_zero.config import PLUGIN_NAME, load_config
    from agentrl.integrations.agent_zero.publisher import Outbox

    # The monologue's own flush has 2 s (`publish_timeout_s`: Agent Zero never waits on NATS
    # longer); on a loaded host a fresh process's first connect can take that, and the event
    # then stays spooled for the next flush (2026-11-30, load 7-10: nothing on the bus).
    # What is left is flushed as `agentrl agent-zero flush` does: the check is that the
    # event reaches the bus through the spool, not how fast
    outbox = Outbox(load_config(root / "usr" / "plugins" / PLUGIN_NAME))
    spooled = len(outbox.spool)
    asyncio.run(outbox.flush(60.0, force=True))
    published = asyncio.run(trajectories_of(nats_url, session))
    print(
        json.dumps(
            {
                "python": list(sys.version_info[:2]),
                "torch": importlib.util.find_spec("torch") is not None,
                "answer": answer,
                "hooks_from": hooks.__file__,
                "tool_names": [[t["action"]["tool_name"] for t in p["turns"]] for p in published],
                "spooled_after_monologue": spooled,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
