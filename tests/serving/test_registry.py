"""The registry on a real nats-server: state machine, compare-and-set, history, retention,
and a server restart that keeps every record and its history."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from agentrl.bus import Bus, EmbeddedNats
from agentrl.contracts.base import utcnow
from agentrl.release.actions import Deployer
from agentrl.serving.errors import DeployError
from agentrl.serving.registry import ModelRecord, Registry


async def test_state_machine_history_and_refusals(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    await bus.ensure_streams()
    reg = await Registry.open(bus.js, f"reg_{uuid.uuid4().hex[:8]}")
    d = Deployer(reg, bus, "pub")
    with pytest.raises(DeployError, match="no previous version"):
        await d.rollback(by="t", reason="nothing yet")
    await d.bootstrap("tiny")
    rec = await d.register(
        checkpoint_path="/x", base_model="tiny", sha256="ab", training_job_id="job-1"
    )
    again = await d.register(
        checkpoint_path="/x", base_model="tiny", sha256="ab", training_job_id="job-1"
    )
    assert again.model_id == rec.model_id == "pub-v1"  # idempotent per training job
    with pytest.raises(DeployError, match="cannot become"):
        await reg.transition("pub-base", "canary", by="t", action="x", reason="y")
    await reg.transition(
        rec.model_id, "rejected", by="t", action="reject", reason="benchmark 0.1 < 0.5"
    )
    from agentrl.serving.config import RolloutPlan

    with pytest.raises(DeployError, match="only a human"):
        await d.start(rec.model_id, RolloutPlan.default("canary", delay_s=1))
    await d.start(
        rec.model_id,
        RolloutPlan.default("canary", delay_s=1),
        approval="manual_approved",
        by="alice",
    )
    with pytest.raises(DeployError, match="between 0 and 100"):
        await d.set_weight(150, by="t")
    await d.promote(by="alice", reason="looks good")
    await d.rollback(by="bob", reason="users complain")
    split, _ = await reg.get_split("pub")
    assert split is not None and split.live == "pub-base" and split.weights == {"pub-base": 100.0}
    history = await reg.history("model.pub-v1")
    states = [h["value"]["state"] for h in history]
    assert states[0] == "candidate" and "rejected" in states and "live" in states
    assert states[-1] == "rolled_back"
    final = await reg.require_model("pub-v1")
    assert [x.by for x in final.decisions][-2:] == ["alice", "bob"]
    with pytest.raises(DeployError, match="no previous version"):
        await d.rollback(by="bob", reason="again")
    await bus.close()


async def test_retention_keeps_best_and_recent(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    reg = await Registry.open(bus.js, f"ret_{uuid.uuid4().hex[:8]}")
    old = utcnow() - timedelta(days=100)
    for i, (state, best) in enumerate([("retired", False), ("retired", True), ("live", False)]):
        await reg.put_model(
            ModelRecord(
                model_id=f"m{i}",
                version=i,
                public_name="p",
                base_model="b",
                state=state,
                best=best,
                updated_at=old,
            )
        )
    await reg.put_model(
        ModelRecord(model_id="m3", version=3, public_name="p", base_model="b", state="rolled_back")
    )
    assert await reg.prune(90) == ["m0"]
    assert [m.model_id for m in await reg.list_models()] == ["m1", "m2", "m3"]
    await bus.close()


async def test_registry_survives_server_restart(tmp_path: Path) -> None:
    server = EmbeddedNats(data_dir=tmp_path)
    server.start()
    try:
        bus = await Bus.connect(server.url)
        reg = await Registry.open(bus.js)
        d = Deployer(reg, None, "pub")
        await d.bootstrap("tiny")
        rec = await d.register(checkpoint_path="/c", base_model="tiny", sha256="ff")
        await reg.transition(rec.model_id, "rejected", by="t", action="reject", reason="safety")
        await bus.close()
    finally:
        server.stop()
    server = EmbeddedNats(data_dir=tmp_path, port=server.port)
    server.start()
    try:
        bus = await Bus.connect(server.url)
        reg = await Registry.open(bus.js)
        got = await reg.require_model(rec.model_id)
        assert got.state == "rejected" and got.decisions[-1].reason == "safety"
        assert [h["value"]["state"] for h in await reg.history(f"model.{rec.model_id}")] == [
            "candidate",
            "rejected",
        ]
        split, _ = await reg.get_split("pub")
        assert split is not None and split.live == "pub-base"
        await bus.close()
    finally:
        server.stop()
