"""Helpers of the training tests: hand-built logged trajectories and rewards (pre-serialised,
published in pipelined batches), settings for tiny jobs, a status collector, a service runner."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agentrl.bus import Bus
from agentrl.core.settings import Settings
from agentrl.training.settings import TrainingSettings

TINY = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "intermediate_size": 64,
}
BASE_TIME = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def trajectory(
    i: int,
    *,
    task: str | None = None,
    domain: str = "coding",
    turns: int = 2,
    profile: str | None = None,
    agent: str = "agent-zero-main",
    when: datetime | None = None,
    completion_id: str | None = None,
    opt_out: bool = False,
) -> dict[str, Any]:
    start = when or BASE_TIME + timedelta(minutes=i)
    tid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"traj-{i}"))
    ts = []
    for k in range(turns):
        action: dict[str, Any] = {
            "type": "tool_call",
            "tool_name": "code_exe",
            "tool_args": {"code": f"print({i} + {k})"},
            "raw_response": json.dumps(
                {
                    "thoughts": ["compute"],
                    "tool_name": "code_exe",
                    "tool_args": {"code": f"print({i}+{k})"},
                }
            ),
        }
        if completion_id and k == 0:
            action["completion_id"] = completion_id
        ts.append(
            {
                "turn_id": k + 1,
                "timestamp": (start + timedelta(seconds=k)).isoformat(),
                "observation": {
                    "type": "user_message" if k == 0 else "tool_result",
                    "content": f"step {k} of task {task or i}",
                },
                "thought_process": ["compute"],
                "action": action,
                "result": {"success": True, "output": str(i + k), "execution_time_ms": 5},
            }
        )
    t: dict[str, Any] = {
        "trajectory_id": tid,
        "session_id": f"s-{i}",
        "agent_id": agent,
        "start_timestamp": start.isoformat(),
        "end_timestamp": (start + timedelta(seconds=turns)).isoformat(),
        "turns": ts,
        "task_context": {
            "task_id": task or f"task-{i}",
            "instructions": f"add numbers {task or i}",
            "domain": domain,
        },
        "metadata": {"model": "agentrl-policy", "rl_opt_out": opt_out},
    }
    if profile:
        t["subordinate_profile"] = profile
    return t


def reward(traj: dict[str, Any], total: float, version: int = 1) -> dict[str, Any]:
    return {
        "reward_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"r-{traj['trajectory_id']}-{version}")),
        "trajectory_id": traj["trajectory_id"],
        "session_id": traj["session_id"],
        "timestamp": traj["end_timestamp"],
        "reward_components": {"task_completion": {"score": total, "weight": 1.0}},
        "total_reward": total,
        "version": version,
    }


async def publish_raw(bus: Bus, subject: str, payloads: list[dict[str, Any]], id_key: str) -> None:
    """Pre-serialised pipelined publishing (contract validation skipped for speed: the
    payloads are built by the helpers above)."""
    items = [(subject, json.dumps(p).encode(), str(p[id_key])) for p in payloads]
    for k in range(0, len(items), 2000):
        await bus.publish_many(items[k : k + 2000])


async def publish_data(bus: Bus, trajs: list[dict[str, Any]], scores: list[float]) -> None:
    await publish_raw(bus, "agent.rl.trajectory.v1", trajs, "trajectory_id")
    await publish_raw(
        bus,
        "agent.rl.reward.v1",
        [reward(t, s) for t, s in zip(trajs, scores, strict=True)],
        "reward_id",
    )


def settings_for(data_dir: Path, url: str) -> Settings:
    return Settings(data_dir=data_dir, nats_url=url)


def tsettings(**kw: Any) -> TrainingSettings:
    base: dict[str, Any] = {
        "threshold": 0,
        "schedule": "",
        "base_model": "tiny",
        "sample_size": 64,
        "batch_size": 16,
        "save_interval": 2,
        "holdout_size": 0.2,
        "tiny_kwargs": TINY,
        "max_length": 256,
        "heartbeat_s": 0.5,
        "status_every_steps": 1,
    }
    base.update(kw)
    return TrainingSettings(**base)


class Statuses:
    """Collects agent.rl.training.status.v1 events (a core subscription)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.sub: Any = None

    async def start(self, bus: Bus) -> Statuses:
        async def on(msg: Any) -> None:
            self.events.append(json.loads(msg.data))

        self.sub = await bus.nc.subscribe("agent.rl.training.status.v1", cb=on)
        return self

    def of(self, job_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["training_job_id"] == job_id]

    def states(self, job_id: str) -> list[str]:
        return [e["status"] for e in self.of(job_id)]

    async def wait(
        self, job_id: str, statuses: tuple[str, ...], timeout: float = 60
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            for e in self.of(job_id):
                if e["status"] in statuses:
                    return e
            await asyncio.sleep(0.05)
        raise AssertionError(f"job {job_id} never reached {statuses}: {self.states(job_id)}")


@contextlib.asynccontextmanager
async def running_service(
    bus: Bus, settings: Settings, ts: TrainingSettings, **kw: Any
) -> AsyncIterator[Any]:
    from agentrl.training.service import TrainingService

    service = TrainingService(bus, settings, ts, **kw)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        yield service
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
