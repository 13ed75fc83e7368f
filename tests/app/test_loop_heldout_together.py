"""The loop's held-out evaluation plays every version's episodes (both pools) in flight
together under one bound (`Agents.heldout_limit`), so the gateway batches the versions'
rows together (one LoRA adapter per row) instead of one version after another, each pool
ending on batches of a few rows. Greedy, each version must get the per-task rows it gets
evaluated alone (success, first tool, failure class, reward, cut). The replies' exact tokens
are not compared: a random tiny model's logits nearly tie everywhere, and the padding of a
batch moves logits by ~1e-5 (7 of 18 episodes' replies differed here; SmolLM2 with the warm
start: docs/bench/2026-12.md, h104). Real gateway (uvicorn, the `openai` SDK), the local engine on the
tiny base with two LoRA checkpoints, the tool-use environment's real tools."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import TINY, write_checkpoint


async def _evaluate(url: str, versions: list[str], together: bool) -> dict[str, list[Any]]:
    from agentrl.app import loop_tooluse
    from agentrl.app.loop_agents import Agents
    from agentrl.app.loop_config import HELDOUT_OFFSET, LoopConfig

    cfg = LoopConfig.tooluse(quick=True, max_tokens=40, max_steps=2)
    tasks = loop_tooluse.heldout_tasks(6, HELDOUT_OFFSET)
    unseen = loop_tooluse.heldout_tasks(3, HELDOUT_OFFSET, "unseen")
    agents = Agents(cfg, None, url, "p", lambda _: None)
    try:
        if together:
            limit = agents.heldout_limit()
            await asyncio.gather(
                *(agents.heldout(v, t, pool, limit=limit)
                  for v in versions for t, pool in ((tasks, "train"), (unseen, "unseen")))
            )  # fmt: skip
        else:
            for v in versions:
                await agents.heldout(v, tasks)
                await agents.heldout(v, unseen, "unseen")
    finally:
        await agents.close()
    return agents.heldout_rows


async def test_versions_evaluated_together_get_the_rows_and_replies_they_get_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrl.bench.acting import _record, _serve
    from agentrl.rollout import worker as worker_mod
    from agentrl.serving.backends import LocalBackend
    from agentrl.serving.gateway import GatewayState, create_gateway_app
    from agentrl.serving.local import LocalEngine

    # a batch smaller than the episodes in flight: rows of both versions share each batch
    engine = LocalEngine("tiny", seed=0, tiny_kwargs=TINY, max_batch_size=8)
    backend = LocalBackend(engine, tmp_path / "cache")
    versions = ["p-v1", "p-v2"]
    for i, v in enumerate(versions):
        folder = Path(write_checkpoint(tmp_path / v, seed=300 + i))
        await backend.prepare(_record(folder, "tiny").model_copy(update={"model_id": v}))
    state = GatewayState("p", timeout_s=120.0)
    for v in versions:
        state.backends[v] = backend
    state.set_split({versions[0]: 100.0}, [versions[0]])
    server, serve_task, port = await _serve(create_gateway_app(state))
    url = f"http://127.0.0.1:{port}/v1"

    replies: dict[Any, list[str]] = {}  # (version, env, seed) -> the episode's replies
    run = worker_mod.RLRolloutWorker.run

    async def keep(self: Any) -> Any:
        ep = await run(self)
        key = (self.agent_policy.model, self.task.env_id, self.task.seed)
        replies[key] = [str(s.raw_policy_output) for s in ep.steps]
        return ep

    monkeypatch.setattr(worker_mod.RLRolloutWorker, "run", keep)
    mixed: list[bool] = []  # per forward pass: rows of both versions in it
    forward = engine._forward

    def seen(adapters: list[str], **kw: Any) -> Any:
        mixed.append(len(set(adapters) - {"__base__"}) > 1)
        return forward(adapters, **kw)

    engine._forward = seen
    try:
        alone = await _evaluate(url, versions, False)
        replies_alone, replies = dict(replies), {}
        assert not any(mixed)
        together = await _evaluate(url, versions, True)
    finally:
        server.should_exit = True
        await serve_task

    assert any(mixed)  # the versions' rows decoded in the same batches
    for v in versions:
        rows = alone[v]
        assert len(rows) == 9 and not any(r["error"] for r in rows)
        # the same outcome, first tool, failure class, reward and cut, task by task
        assert sorted(together[v], key=str) == sorted(rows, key=str), v
    assert replies.keys() == replies_alone.keys() and len(replies) >= 12  # (pools share seeds)
    # the versions differ (their adapters): a mix-up of adapters between rows would show
    assert any(replies[("p-v1", *k[1:])] != replies[("p-v2", *k[1:])]
               for k in replies if k[0] == "p-v1")  # fmt: skip
