"""Training per lineage through the real service on a real nats-server: the threshold counts
per lineage (the deployment registry's agent / profile -> lineage mapping), each job's data
filter names its own lineage's agents only (an agent seen in two lineages is nobody's), its
request, checkpoints and statuses name the lineage, and a lineage job that could read every
lineage's trajectories is refused."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from training_helpers import publish_data, running_service, settings_for, trajectory, tsettings

from agentrl.bus import Bus, PermanentError
from agentrl.contracts.training import DatasetFilter
from agentrl.release.lineage import Lineages, Routing
from agentrl.serving.registry import Registry
from agentrl.training.dataset import Record, apply_filters


def _agents(i: int) -> tuple[str, str | None]:
    """(agent id, subordinate profile) of trajectory i: coder -> a (by id), sub-r with the
    researcher profile -> b, the main agent -> the default lineage."""
    return [("coder", None), ("sub-r", "researcher"), ("agent-zero-main", None)][i % 3]


async def _wait(cond, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met")


async def test_jobs_never_read_another_lineages_trajectories(nats, data_dir, monkeypatch):
    bucket = f"models_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("AGENTRL_DEPLOY_BUCKET", bucket)
    settings = settings_for(data_dir, nats.url)
    bus = await Bus.connect(nats.url, settings=settings)
    await bus.ensure_streams()
    lineages = Lineages(await Registry.open(bus.js, bucket), "agentrl-policy")
    await lineages.create("agent0/coder", base_model="tiny", agents=["coder"], by="t")
    await lineages.create("agent0/research", base_model="tiny", profiles=["researcher"], by="t")
    routing = await lineages.routing()
    trajs = []
    for i in range(36):
        agent, profile = _agents(i)
        trajs.append(trajectory(i, agent=agent, profile=profile))
    # one agent id under two lineages (a profile on one trajectory, none on the other)
    trajs += [
        trajectory(100, agent="shared", profile="researcher"),
        trajectory(101, agent="shared"),
    ]
    ts = tsettings(threshold=10, threshold_scope="lineage", devices=[], init_from="live")
    queued: dict[str, object] = {}

    async def on_status(msg) -> None:  # type: ignore[no-untyped-def]
        import json

        ev = json.loads(msg.data)
        if ev.get("status") == "queued":
            queued[ev["training_job_id"]] = (ev.get("metadata") or {}).get("lineage")

    sub = await bus.nc.subscribe("agent.rl.training.status.v1", cb=on_status)
    try:
        await publish_data(bus, trajs, [0.5] * len(trajs))
        async with running_service(bus, settings, ts) as svc:
            await _wait(lambda: len(svc.store.jobs()) == 3)
            await asyncio.sleep(0.5)
            jobs = {j.request["metadata"]["lineage"]: j for j in svc.store.jobs()}
            # the first status (queued, before the job's row exists) names its lineage too:
            # the deployment's fleet routes each status to its lineage's controller
            await _wait(lambda: len(queued) == 3)
            assert queued == {j.job_id: name for name, j in jobs.items()}
            assert sorted(jobs) == ["agent0/coder", "agent0/research", "agentrl-policy"]
            filters = {
                k: j.request["training_config"]["dataset"]["filter"]["agent_ids"]
                for k, j in jobs.items()
            }
            assert filters == {
                "agent0/coder": ["coder"],
                "agent0/research": ["sub-r"],
                "agentrl-policy": ["agent-zero-main"],
            }
            for name, job in jobs.items():
                assert job.request["training_config"]["init_from"] == f"live:{name}"
                assert f"/lineages/{name.replace('/', '_')}/" in svc._storage_path(job)
                status = svc.build_status(job.job_id, "queued")
                assert status.metadata.model_extra["lineage"] == name  # type: ignore[union-attr]
                # what the job reads: its own lineage's trajectories, never another's
                flt = DatasetFilter.model_validate(
                    job.request["training_config"]["dataset"]["filter"]
                )
                rewards = {t["trajectory_id"]: {"total_reward": 0.5, "version": 1} for t in trajs}
                records, _ = apply_filters(trajs, rewards, flt)
                assert records
                owners = {_owner(routing, r) for r in records}
                assert owners == {name}, (name, owners)
            # a lineage's job without its agents would read everything: refused
            req = jobs["agent0/coder"].request | {"training_job_id": str(uuid.uuid4())}
            req["training_config"] = dict(req["training_config"]) | {
                "dataset": {"source": "nats_stream", "stream_name": "RL_TRAJECTORIES"}
            }
            import json

            with pytest.raises(PermanentError, match="must name its agents"):
                await svc.handle_request(json.dumps(req).encode())
    finally:
        await sub.unsubscribe()
        await bus.close()


def _owner(routing: Routing, record: Record) -> str:
    t = record.trajectory
    return routing.of_agent(t["agent_id"], t.get("subordinate_profile"))
