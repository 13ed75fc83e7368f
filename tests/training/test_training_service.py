"""The training service end to end on a real nats-server with a tiny model: threshold trigger
-> one job -> status events -> checkpoint -> GET /models; cancel; a killed job process; a
killed service; redelivered and invalid requests; bad configurations."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from training_helpers import (
    TINY,
    Statuses,
    publish_data,
    running_service,
    settings_for,
    trajectory,
    tsettings,
)

from agentrl.bus import Bus
from agentrl.contracts.base import new_id
from agentrl.training.requests import fill_request


async def _bus(nats, data_dir) -> Bus:
    bus = await Bus.connect(nats.url, settings=settings_for(data_dir, nats.url))
    await bus.ensure_streams()
    return bus


async def _wait(cond, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def _progress_at(statuses: Statuses, job_id: str, step: int) -> bool:
    return any(
        (e.get("progress") or {}).get("current_step", 0) >= step
        for e in statuses.of(job_id)
        if e["status"] == "running"
    )


async def test_threshold_job_completes_and_model_is_listed(nats, data_dir):
    bus = await _bus(nats, data_dir)
    statuses = await Statuses().start(bus)
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(threshold=5000, sample_size=48)
    trajs = [trajectory(i, task=f"t{i // 4}") for i in range(5000)]
    try:
        await publish_data(bus, trajs, [(i % 4) / 3 for i in range(5000)])
        async with running_service(bus, settings, ts) as svc:
            await _wait(lambda: svc.store.jobs(), 30)
            jobs = svc.store.jobs()
            assert len(jobs) == 1 and jobs[0].request["trigger_reason"] == "threshold_reached"
            job_id = jobs[0].job_id
            final = await statuses.wait(job_id, ("completed", "failed"), 120)
            assert final["status"] == "completed", final
            states = statuses.states(job_id)
            assert states[0] == "queued" and states[-1] == "completed"
            assert set(states[1:-1]) == {"running"} and len(states) >= 4
            # The seed's fields, filled for real.
            assert final["progress"]["percent_complete"] == 100.0
            assert final["progress"]["current_step"] == final["progress"]["total_steps"] > 0
            assert final["metrics"]["current"]["loss"] is not None
            assert "holdout_reward" in final["evaluation_results"]
            assert "improvement_over_baseline" in final["evaluation_results"]
            ev = final["evaluation_results"]  # named an off-policy estimate, with its spread
            assert "off-policy estimate" in ev["method"] and ev["effective_sample_size"] > 0
            assert ev["improvement_ci95_low"] <= ev["improvement_over_baseline"]
            assert ev["improvement_over_baseline"] <= ev["improvement_ci95_high"]
            usage = final["resource_usage"]
            assert usage["peak_memory_gb"] > 0 and usage["total_training_time_seconds"] > 0
            arts = final["artifacts"]
            ckpt = Path(arts["final_checkpoint"])
            assert (ckpt / "manifest.json").exists() and (
                ckpt / "adapter_model.safetensors"
            ).exists()
            assert arts["base_model"] == "tiny"
            # the next job of this base model may continue from it before it is registered
            recent = {"path": str(ckpt), "base_model": "tiny"}
            assert svc.store.get_state("recent_checkpoint") == recent
            meta = final["metadata"]  # what the job trained on, counted
            assert meta["dataset"]["trajectories"] == 5000 and meta["dataset"]["sampled"] == 48
            assert meta["samples"] > 0 and meta["exact_token_samples"] == 0
            assert Path(arts["training_curves"]).exists() and Path(arts["model_card"]).exists()
            steps = [
                e["progress"]
                for e in statuses.of(job_id)
                if e["status"] == "running" and e["progress"].get("current_step", 0) > 0
            ]
            assert steps and all("eta_seconds" in p for p in steps)
            # what the job's wall time was made of (bench training's overhead parts)
            from agentrl.bench.training import job_parts

            parts = job_parts(svc.root / "jobs" / job_id / "events.jsonl")
            assert set(parts) == {"data_s", "model_s", "steps_s", "between_steps_s", "end_s"}
            assert all(v >= -0.05 for v in parts.values()) and parts["steps_s"] > 0
            assert parts["steps_s"] == pytest.approx(usage["train_step_seconds"], abs=0.01)
            # GET /models lists the checkpoint (the real API app over the same bus).
            from agentrl.app.api import create_app

            app = create_app(settings, bus)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://api"
            ) as client:
                models = (await client.get("/models")).json()["models"]
                assert [m["model_id"] for m in models] == [job_id]
                assert models[0]["final_checkpoint"] == str(ckpt)
                status = (await client.get(f"/training/{job_id}/status")).json()
                assert status["status"] == "completed"
        async with running_service(bus, settings, ts) as svc:  # a second start
            await asyncio.sleep(1.5)
            assert len(svc.store.jobs()) == 1 and svc.counters["threshold_triggers"] == 0
    finally:
        await bus.close()


async def test_cancel_and_killed_job_process(nats, data_dir, no_launcher):
    bus = await _bus(nats, data_dir)
    statuses = await Statuses().start(bus)
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(
        devices=["cpu", "cpu"], batch_size=2, save_interval=1, sample_size=40, holdout_size=0.0
    )
    await publish_data(
        bus, [trajectory(i, task=f"t{i // 4}") for i in range(40)], [(i % 4) / 3 for i in range(40)]
    )
    try:
        async with running_service(bus, settings, ts) as svc:
            reqs = [fill_request({"training_config": {"base_model": "tiny"}}, ts) for _ in range(2)]
            for r in reqs:
                await bus.publish(r)
            cancel_id, kill_id = reqs[0].training_job_id, reqs[1].training_job_id
            # Kill one job process as soon as it runs; cancel the other once it has a checkpoint.
            await _wait(lambda: "running" in statuses.states(kill_id), 60)
            os.kill(svc.store.get(kill_id).pid, signal.SIGKILL)
            await _wait(lambda: _progress_at(statuses, cancel_id, 2), 180)
            # Cancel through the bus (what the API and CLI publish).
            t0 = time.monotonic()
            await bus.publish_json(
                "agent.rl.training.cancel.v1",
                {"training_job_id": cancel_id},
                msg_id=f"c-{cancel_id}",
            )
            cancelled = await statuses.wait(cancel_id, ("cancelled", "completed", "failed"), 10)
            took = time.monotonic() - t0
            assert cancelled["status"] == "cancelled" and took <= 5.0, (cancelled, took)
            kept = Path(cancelled["artifacts"]["last_checkpoint"])
            assert (kept / "manifest.json").exists(), "the last checkpoint is kept"
            killed = await statuses.wait(kill_id, ("failed", "completed"), 30)
            assert killed["status"] == "failed" and killed["error"]["code"] == "INFRA"
            assert "SIGKILL" in killed["error"]["message"]
            assert svc.store.get(cancel_id).status == "cancelled"
            # The service still serves: a queued job can still be cancelled right away.
            later = fill_request({"training_config": {"base_model": "tiny"}}, ts)
            svc.ts.devices = []  # hold it in the queue
            await bus.publish(later)
            await statuses.wait(later.training_job_id, ("queued",), 10)
            assert await svc.cancel(later.training_job_id)
            await statuses.wait(later.training_job_id, ("cancelled",), 10)
    finally:
        await bus.close()


async def test_bad_jobs_fail_with_their_code_and_service_goes_on(nats, data_dir):
    bus = await _bus(nats, data_dir)
    statuses = await Statuses().start(bus)
    settings = settings_for(data_dir, nats.url)
    # /proc is an allowed checkpoint prefix here: the INFRA case is an unwritable store.
    ts = tsettings(devices=["cpu", "cpu"], checkpoint_prefixes=["/proc"])
    await publish_data(
        bus, [trajectory(i, task=f"t{i // 4}") for i in range(24)], [(i % 4) / 3 for i in range(24)]
    )
    bad_store = "/proc/agentrl-cannot-write-here"
    cases = {
        "CONFIG": {"training_config": {"base_model": "/nonexistent/model-folder"}},
        "INFRA": {
            "training_config": {"base_model": "tiny", "checkpointing": {"storage_path": bad_store}}
        },
        "DATA": {
            "training_config": {"base_model": "tiny", "dataset": {"filter": {"min_reward": 5.0}}}
        },
        "CONVERGENCE": {
            "training_config": {
                "base_model": "tiny",
                "hyperparameters": {"learning_rate": 1e30, "batch_size": 2},
            }
        },
    }
    try:
        async with running_service(bus, settings, ts):
            # The other kind of job shares the lifecycle and runs beside the failures.
            env_job = fill_request(
                {
                    "training_config": {
                        "base_model": "tiny",
                        "environment": {
                            "env_id": "frozenlake-4x4",
                            "iterations": 2,
                            "tasks_per_iteration": 1,
                            "group_size": 2,
                            "max_steps": 2,
                            "max_new_tokens": 8,
                            "eval_episodes": 1,
                        },
                    }
                },
                ts,
            )
            await bus.publish(env_job)
            ids = {}
            for code, body in cases.items():
                req = fill_request(body, ts)
                ids[code] = req.training_job_id
                await bus.publish(req)
            for code, job_id in ids.items():
                ev = await statuses.wait(job_id, ("failed", "completed"), 120)
                assert ev["status"] == "failed", (code, ev)
                err = ev["error"]  # agentrl's own codes travel as UNKNOWN + detail_code
                assert err.get("detail_code", err["code"]) == code, (code, err)
                assert ev["error"]["message"]
            done = await statuses.wait(env_job.training_job_id, ("completed", "failed"), 120)
            assert done["status"] == "completed", done
            assert (Path(done["artifacts"]["final_checkpoint"]) / "manifest.json").exists()
            assert done["progress"]["current_step"] == 2
            assert "holdout_reward" in done["evaluation_results"]
            data_msg = next(e for e in statuses.of(ids["DATA"]) if e["status"] == "failed")
            assert "min_reward -24" in data_msg["error"]["message"]
            assert "traceback" in data_msg["error"]
    finally:
        await bus.close()


async def test_redelivered_request_is_one_job_and_invalid_is_dead_lettered(nats, data_dir):
    bus = await _bus(nats, data_dir)
    statuses = await Statuses().start(bus)
    settings = settings_for(data_dir, nats.url)
    ts = tsettings(devices=[])
    try:
        async with running_service(bus, settings, ts) as svc:
            req = fill_request({"training_config": {"base_model": "tiny"}}, ts)
            data = req.to_json()
            # Two deliveries under different message ids pass JetStream's de-duplication.
            await bus.publish_raw("agent.rl.training.request.v1", data, "first")
            await bus.publish_raw("agent.rl.training.request.v1", data, "second")
            await _wait(lambda: svc.counters["duplicates"] == 1, 10)
            assert len(svc.store.jobs()) == 1
            assert statuses.states(req.training_job_id) == ["queued"]
            bad_id = new_id()
            bad = json.loads(data)
            bad.update(training_job_id=bad_id, priority="someday")
            await bus.publish_raw("agent.rl.training.request.v1", json.dumps(bad).encode(), "bad")
            ev = await statuses.wait(bad_id, ("failed",), 10)
            assert ev["error"]["detail_code"] == "CONFIG" and "priority" in ev["error"]["message"]
            await _wait(lambda: svc.counters["invalid"] == 1, 10)
            dlq = await bus.dead_letters()
            assert any("priority" in d["error"] for d in dlq)
            assert len(svc.store.jobs()) == 1
    finally:
        await bus.close()


SERVICE = """
import asyncio, sys
from agentrl.bus import Bus
from agentrl.core.settings import Settings
from agentrl.training.service import TrainingService
async def main():
    settings = Settings()
    bus = await Bus.connect(settings.nats_url, settings=settings)
    await TrainingService(bus, settings).run(asyncio.Event())
asyncio.run(main())
"""
RESTART_LEASE_TTL_S = 3.0


async def test_killed_service_resumes_the_job_after_restart(nats, data_dir):
    bus = await _bus(nats, data_dir)
    statuses = await Statuses().start(bus)
    settings = settings_for(data_dir, nats.url)
    # 20 trajectories: 16 steps, each with its checkpoint (the kill lands at step 2; the
    # resumed job's 30 more steps of the 40 it had took ~9 s quiet, 3x that under load)
    ts = tsettings(batch_size=2, save_interval=1, sample_size=20)
    await publish_data(
        bus, [trajectory(i, task=f"t{i // 4}") for i in range(20)], [(i % 4) / 3 for i in range(20)]
    )
    env = {
        **os.environ,
        "AGENTRL_DATA_DIR": str(data_dir),
        "AGENTRL_NATS_URL": nats.url,
        # the restarted service takes the job once the killed one's lease has expired: a 3 s
        # TTL (as the runner-replica tests use) instead of the default 10 s of waiting
        "AGENTRL_TRAINING_LEASE_TTL_S": str(RESTART_LEASE_TTL_S),
        **{
            f"AGENTRL_TRAINING_{k.upper()}": (
                json.dumps(v) if isinstance(v, dict | list) else str(v)
            )
            for k, v in ts.model_dump().items()
            if v is not None
        },
    }
    proc = subprocess.Popen([sys.executable, "-c", SERVICE], env=env)
    try:
        req = fill_request({"training_config": {"base_model": "tiny"}}, ts)
        await bus.publish(req)
        job_id = req.training_job_id
        await _wait(lambda: _progress_at(statuses, job_id, 2), 180)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        async with running_service(bus, settings, ts, lease_ttl_s=RESTART_LEASE_TTL_S) as svc:
            final = await statuses.wait(job_id, ("completed", "failed"), 180)
            states = statuses.states(job_id)
            assert svc.store.get(job_id).status == final["status"], "never left 'running'"
            # A checkpoint existed when the service died: the job resumes from it.
            assert final["status"] == "completed", final
            resumed = [e for e in statuses.of(job_id) if e["status"] == "queued"][-1]
            assert resumed["metadata"]["resume_from"].rsplit("/", 1)[-1].startswith("step-")
            assert states.count("queued") == 2 and states[-1] == "completed"
            assert final["progress"]["current_step"] == final["progress"]["total_steps"]
    finally:
        if proc.poll() is None:
            proc.kill()
        await bus.close()


def test_tiny_settings_round_trip():
    assert tsettings().tiny_kwargs == TINY
