"""The loop's held-out evaluation measures a trained version that no longer serves (rejected
by validation): the loop asks the deploy service over the bus to hold it (`agentrl.deploy.
hold.<public>`), the gateway loads it for the evaluation only — no traffic share, no
decision — the agents measure it by its own name through the gateway, and it is released
and unloaded after. Before, a rejected candidate's row read "not served", so a run could not
say whether its job had learned anything. Real stack: nats-server, the deployment service
with its gateway (uvicorn), the tiny model and a LoRA checkpoint of it, FrozenLake episodes
through the `openai` SDK."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import torch

from agentrl.bus.server import free_port


def _checkpoint(folder: Path) -> str:
    """A LoRA checkpoint of the tiny base the gateway serves (its default shape)."""
    from agentrl.llm.checkpoint import CheckpointManager
    from agentrl.llm.config import TrainerConfig
    from agentrl.llm.loading import LoraSettings, apply_lora, load_policy
    from agentrl.llm.trainer import PolicyTrainer

    policy = load_policy("tiny", seed=0)
    policy.lora = LoraSettings(r=4, target_modules=("q_proj", "v_proj"))
    policy.model = apply_lora(policy.model, policy.lora)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    cfg = TrainerConfig(
        model="tiny", lora_r=4, batch_size=2, total_steps=2, storage_path=str(folder)
    )
    return CheckpointManager(str(folder)).save(PolicyTrainer(policy, cfg), {}, name="final")


async def test_a_rejected_version_gets_a_heldout_figure_and_is_unloaded_after(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrl.app.loop import (
        Agents,
        LoopConfig,
        Run,
        _served_models,
        _wait_http,
        evaluate_heldout,
        table,
    )
    from agentrl.app.stack import stack_services
    from agentrl.core.settings import Settings
    from agentrl.release.actions import Deployer, checkpoint_sha
    from agentrl.release.holds import read_holds
    from agentrl.serving.registry import Registry

    tag = uuid.uuid4().hex[:8]
    public = f"pol-{tag}"
    for key, value in {
        "AGENTRL_DEPLOY_PUBLIC_MODEL": public,
        "AGENTRL_DEPLOY_BUCKET": f"models_{tag}",
        "AGENTRL_DEPLOY_BASE_MODEL": "tiny",
        "AGENTRL_CAPTURE_ENABLED": "false",
    }.items():
        monkeypatch.setenv(key, value)
    settings = Settings(data_dir=tmp_path / "data", gateway_port=free_port(), api_port=free_port())
    said: list[str] = []
    cfg = LoopConfig.quick(heldout_seeds=3, max_steps=2)
    async with stack_services(nats_url, settings, only={"deployment controller"}) as stack:
        registry = await Registry.open(stack.bus.js, f"models_{tag}")
        deadline = time.monotonic() + 60
        while not await registry.list_models(public):  # the service bootstraps the base
            assert time.monotonic() < deadline, stack.health_report()
            await asyncio.sleep(0.05)
        # the gateway listens a moment after the service registered itself (the loop's own
        # start waits for its answer too): at load 4 it refused the first look
        await _wait_http(f"{stack.gateway_url}/models", timeout=60)
        ckpt = _checkpoint(tmp_path / "ckpt")
        sha = checkpoint_sha(ckpt, tmp_path / "sha-cache")
        record = await Deployer(registry, stack.bus, public, "").register(
            checkpoint_path=ckpt, base_model="tiny", sha256=sha, training_job_id="j1", by="test"
        )
        v1 = str(record.model_id)
        await registry.transition(
            v1, "rejected", by="test", action="reject", reason="benchmark -0.2 against live"
        )
        run = Run(cfg, said.append)
        run.stack, run.bus, run.public = stack, stack.bus, public
        agents = Agents(cfg, stack.bus, stack.gateway_url, public, said.append)
        try:
            await evaluate_heldout(run, agents, await registry.list_models(public))
        finally:
            await agents.close()
        rows = {r.model_id: r for r in run.result.versions}
        row = rows[v1]
        assert row.state == "rejected" and row.decision == "reject" and row.held_for_eval
        assert row.heldout_n == 3 and row.heldout_success is not None, said
        assert row.traffic_share == 0.0
        assert f"held-out: {v1} (rejected) loaded for the evaluation only" in said
        assert await read_holds(registry) == {}  # released
        deadline = time.monotonic() + 10
        while v1 in await _served_models(stack.gateway_url):  # unloaded within a sync or two
            assert time.monotonic() < deadline, f"{v1} still served after the evaluation"
            await asyncio.sleep(0.05)
        assert agents.heldout_errors.get(v1, 0) == 0
        base = rows[f"{public}-base"]
        assert base.heldout_n == 3 and not base.held_for_eval
    summary = run.result.summary()
    assert summary["candidate_model"] == v1 and summary["candidate_state"] == "rejected"
    assert summary["candidate_heldout_success"] == row.heldout_success
    # the existing keys keep their meaning: what served (the base), not the rejected one
    assert summary["best_heldout_success"] == base.heldout_success
    assert "(loaded to evaluate)" in table(run.result)
