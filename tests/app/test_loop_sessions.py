"""`agentrl loop`'s agents keep a group on one version (issue 28.8): every turn carries the
group id as the gateway's session key, so under a 50/50 split each trajectory is played by
one version and credited to it; an episode several versions played is credited to none and
counted. Real gateway over HTTP, two real upstream servers, a real nats-server."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import uvicorn

from agentrl.app.loop import Agents, LoopConfig, served_versions
from agentrl.bench.testing_server import ScriptedOpenAIServer, ScriptedReply
from agentrl.bus import Bus
from agentrl.bus.server import free_port
from agentrl.serving.backends import UpstreamBackend
from agentrl.serving.gateway import GatewayState, create_gateway_app


async def test_every_turn_of_a_group_goes_to_one_version(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    public = "loop-sessions"
    with (
        ScriptedOpenAIServer([ScriptedReply(content="right")]) as a,
        ScriptedOpenAIServer([ScriptedReply(content="down")]) as b,
    ):
        state = GatewayState(public)
        state.backends["va"] = UpstreamBackend(a.base_url, timeout_s=10)
        state.backends["vb"] = UpstreamBackend(b.base_url, timeout_s=10)
        state.set_split({"va": 50.0, "vb": 50.0}, ["vb", "va"])
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(
                create_gateway_app(state),
                host="127.0.0.1",
                port=port,
                log_level="warning",
                lifespan="off",
            )
        )
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        cfg = LoopConfig.quick()
        agents = Agents(cfg, bus, f"http://127.0.0.1:{port}/v1", public, lambda _: None)
        groups = 0
        try:
            # a group's key is a fresh uuid: 8 groups all land on one side 1 time in 128
            # (CI stop 41), so play on until both have served, 2**-39 odds of failing at 40
            while groups < 8 or (not (a.requests and b.requests) and groups < 40):
                await agents.group(groups)
                groups += 1
        finally:
            await agents.close()
            server.should_exit = True
            await task
            await bus.close()
        assert a.requests and b.requests  # both versions served ...
        # ... but each group (one session) was played by one of them, every turn
        assert agents.mixed == 0 and "unknown" not in agents.by_model
        assert set(agents.by_model) == {"va", "vb"}
        assert sum(agents.by_model.values()) == groups * cfg.group_size


def test_an_episode_two_versions_played_is_credited_to_none() -> None:
    def episode(*models: str) -> Any:
        return SimpleNamespace(
            steps=[SimpleNamespace(policy_logprobs={"model": m}) for m in models]
        )

    assert served_versions(episode("va", "va", "va")) == ["va"]
    assert served_versions(episode("va", "vb", "va")) == ["va", "vb"]
    assert served_versions(SimpleNamespace(steps=[SimpleNamespace(policy_logprobs=None)])) == []
