"""What the Agent Zero tests share besides their fixtures (`conftest.py`): the recordings, an
installed checkout, readers of a stream."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from a0_standins import Agent, Config, Context, Driver, Extensions, Message

from agentrl.integrations.agent_zero import state
from agentrl.integrations.agent_zero.install import install

DATA = Path(__file__).parent / "data"


def recording(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def make_agent(rec: dict[str, Any]) -> Agent:
    """The recording's agent, in a chat (context) of its own."""
    context = Context(f"{rec['context_id']}-{uuid.uuid4().hex[:8]}")
    spec = rec["agent"]
    agent = Agent(spec["number"], Config(spec["profile"]), context)
    um = rec["user_message"]
    agent.last_user_message = Message(um["content"], um.get("id", ""))
    return agent


class Checkout:
    """An Agent Zero folder with the plugin installed and the stand-in helpers importable."""

    def __init__(self, root: Path, nats_url: str, **config: Any) -> None:
        self.root = root
        self.installed = install(root)
        self.plugin_dir = self.installed.plugin_dir
        self.spool_dir = root / "usr" / "agentrl" / "spool"
        self.write_config(nats_url=nats_url, **config)
        self.extensions = Extensions([self.plugin_dir / "extensions" / "python"])
        self.driver = Driver(self.extensions)

    def write_config(self, **values: Any) -> None:
        path = self.plugin_dir / "config.json"
        current = json.loads(path.read_text()) if path.exists() else {}
        current.update(values)
        path.write_text(json.dumps(current))
        state.reset_caches()

    def agent(self, rec: dict[str, Any]) -> Agent:
        return make_agent(rec)

    async def run(self, rec: dict[str, Any], agent: Agent | None = None) -> tuple[Agent, Any]:
        agent = agent or self.agent(rec)
        answer = await self.driver.monologue(agent, rec["iterations"])
        return agent, answer


async def stream_payloads(url: str, subject: str, idle: float = 0.5) -> list[dict[str, Any]]:
    """Every payload stored on `subject`, in stream order."""
    import nats
    import nats.js.errors

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            sub = await js.subscribe(subject, ordered_consumer=True)
        except nats.js.errors.NotFoundError:  # no stream yet: nothing was published
            return []
        out = []
        while True:
            try:
                msg = await sub.next_msg(timeout=idle)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            out.append(json.loads(msg.data))
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def trajectories_of(url: str, session_id: str) -> list[dict[str, Any]]:
    return [
        p
        for p in await stream_payloads(url, "agent.rl.trajectory.v1")
        if p["session_id"] == session_id
    ]
