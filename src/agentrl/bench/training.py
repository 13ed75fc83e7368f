"""`agentrl bench training`: dataset loading rate, control-path latencies, job overhead.

Everything runs against a fresh embedded nats-server and the real service with the tiny
random model (the model's size is irrelevant to what is measured here, except the job
overhead, which is reported for the tiny model: a bigger model makes steps longer and the
overhead fraction smaller).

- dataset: N trajectories + N rewards published, then, timed as one, what a job does with
  them: read back from JetStream (`read_subject`: batched pull requests into a raw
  subscription), parsed, joined with the latest reward, filtered, sampled and built into
  training samples (`build_samples`: advantages, chat-template token ids as ChatML pieces
  through a pre-token id cache, see `training.prompt_ids` and `training.bpe_words`) for
  all N; the three stages are shown apart. (Until 2026-11-25 the figure combined a load
  rate with a tokenisation rate measured on a 5,000-trajectory subset.)
- control path: request published -> `running` status (process spawned; the model load is
  measured apart: running -> first training step), then cancel -> `cancelled`.
- job overhead: one job sized to about `job_seconds` of training steps; overhead = (wall
  from running to completed - seconds inside trainer steps) / wall, and what it is made of
  from the job's own events (`job_parts`: data, model, between steps, end; `job_sample`:
  trajectories seen, sampled, payloads read). Most of it is a fixed cost per job (reading
  the ids and rewards to draw the sample, loading the model, writing the final
  checkpoint), so the fraction depends on the job's length. Measured 2026-11-27 at load
  3.5-4.5 with 100,000 logged trajectories, before the job read only its sample: ~20 s of
  overhead, 16 s of it the data phase (the whole stream read, parsed and joined to draw
  a small sample), the model 1 s, the end 0.7 s. Since then a job whose sample is under a
  third of the stream reads the ids (headers only) and the rewards, then fetches only the
  sampled payloads (`training.dataset.sample_from_stream`).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentrl.training.options import TrainingBench

TINY = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "intermediate_size": 64,
}


def _trajectory(i: int) -> dict[str, Any]:
    start = datetime(2026, 11, 20, tzinfo=UTC) + timedelta(seconds=i)
    tid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench-{i}"))
    turns = []
    for k in range(2):
        turns.append(
            {
                "turn_id": k + 1,
                "timestamp": start.isoformat(),
                "observation": {
                    "type": "user_message" if k == 0 else "tool_result",
                    "content": f"observation {k} of task {i % 5000}",
                },
                "thought_process": ["think"],
                "action": {
                    "type": "tool_call",
                    "tool_name": "code_exe",
                    "tool_args": {"code": f"print({i})"},
                    "raw_response": json.dumps(
                        {
                            "thoughts": ["think"],
                            "tool_name": "code_exe",
                            "tool_args": {"code": f"print({i})"},
                        }
                    ),
                },
                "result": {"success": True, "output": str(i)},
            }
        )
    return {
        "trajectory_id": tid,
        "session_id": f"s{i}",
        "agent_id": "agent-zero-main",
        "start_timestamp": start.isoformat(),
        "end_timestamp": (start + timedelta(seconds=2)).isoformat(),
        "turns": turns,
        "task_context": {
            "task_id": f"task-{i % 5000}",
            "instructions": f"task {i % 5000}",
            "domain": ("coding", "research")[i % 2],
        },
        "metadata": {"model": "agentrl-policy"},
    }


def _reward(t: dict[str, Any], i: int) -> dict[str, Any]:
    return {
        "reward_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench-r-{i}")),
        "trajectory_id": t["trajectory_id"],
        "session_id": t["session_id"],
        "timestamp": t["end_timestamp"],
        "reward_components": {"task_completion": {"score": (i % 7) / 6, "weight": 1.0}},
        "total_reward": (i % 7) / 6,
    }


async def _publish(bus: Any, n: int, offset: int = 0) -> None:
    batch = 5000
    for k in range(offset, offset + n, batch):
        trajs = [_trajectory(i) for i in range(k, min(k + batch, offset + n))]
        items = [
            ("agent.rl.trajectory.v1", json.dumps(t).encode(), t["trajectory_id"]) for t in trajs
        ]
        items += [
            ("agent.rl.reward.v1", json.dumps(r).encode(), r["reward_id"])
            for r in (_reward(t, k + j) for j, t in enumerate(trajs))
        ]
        await bus.publish_many(items)


async def bench_dataset(bus: Any, n: int) -> dict[str, float]:
    """The job's dataset path end to end on all `n` trajectories, timed as one: read both
    subjects from JetStream, parse, join with the latest reward, filter, sample, and build
    the training samples (advantages, chat-template token ids)."""
    from agentrl.contracts.training import DatasetFilter
    from agentrl.llm.loading import load_smollm2_tokenizer
    from agentrl.training.dataset import (
        apply_filters,
        gc_paused,
        latest_rewards,
        parse_all,
        read_subject,
        seeded_sample,
    )
    from agentrl.training.samples import build_samples

    await _publish(bus, n)
    tok = load_smollm2_tokenizer()
    t0 = time.perf_counter()
    c0 = time.process_time()  # this process's CPU (nats-server's is apart)
    with gc_paused(freeze=True):  # as the job does while it loads its data
        raw_t = await read_subject(bus.js, "RL_TRAJECTORIES", "agent.rl.trajectory.v1")
        raw_r = await read_subject(bus.js, "RL_REWARDS", "agent.rl.reward.v1")
        t_read = time.perf_counter() - t0
        records, _ = apply_filters(
            parse_all(raw_t), latest_rewards(parse_all(raw_r)), DatasetFilter()
        )
        records = seeded_sample(records, None, 0)
        del raw_t, raw_r
    t_load = time.perf_counter() - t0 - t_read
    t1 = time.perf_counter()
    samples, _ = build_samples(records, tok)
    t_build = time.perf_counter() - t1
    total = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {
        "cpu_s": cpu,
        "trajectories": float(len(records)),
        "samples": float(len(samples)),
        "read_s": t_read,
        "load_s": t_load,
        "build_s": t_build,
        "total_s": total,
        "end_to_end_rate": len(records) / total,
    }


async def bench_jobs(bus: Any, settings: Any, jobs: int, job_seconds: float) -> dict[str, Any]:
    from agentrl.training.requests import fill_request
    from agentrl.training.service import TrainingService
    from agentrl.training.settings import TrainingSettings

    ts = TrainingSettings(
        threshold=0,
        schedule="",
        base_model="tiny",
        tiny_kwargs=TINY,
        sample_size=2000,
        batch_size=8,
        save_interval=1000,
        max_length=256,
        heartbeat_s=0.5,
        status_every_steps=1,
        holdout_size=0.05,
    )
    events: list[tuple[float, dict[str, Any]]] = []

    async def on(msg: Any) -> None:
        events.append((time.perf_counter(), json.loads(msg.data)))

    sub = await bus.nc.subscribe("agent.rl.training.status.v1", cb=on)
    service = TrainingService(bus, settings, ts)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))

    async def wait(job: str, pred: Any, timeout: float) -> tuple[float, dict[str, Any]]:
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            for t, e in events:
                if e["training_job_id"] == job and pred(e):
                    return t, e
            await asyncio.sleep(0.01)
        raise TimeoutError(f"job {job}: condition not reached in {timeout}s")

    to_running: list[float] = []
    model_load: list[float] = []
    cancel: list[float] = []
    lost = 0
    terminal = ("completed", "failed", "cancelled")
    try:
        for _ in range(jobs):
            req = fill_request({"training_config": {"base_model": "tiny"}}, ts)
            t0 = time.perf_counter()
            await bus.publish(req)
            try:
                t_run, _ = await wait(req.training_job_id, lambda e: e["status"] == "running", 60)
                t_step, _ = await wait(
                    req.training_job_id,
                    lambda e: (e.get("progress") or {}).get("current_step", 0) >= 1,
                    300,
                )
                t_c = time.perf_counter()
                await bus.publish_json(
                    "agent.rl.training.cancel.v1",
                    {"training_job_id": req.training_job_id},
                    msg_id=f"cancel:{req.training_job_id}",
                )
                t_end, ev = await wait(req.training_job_id, lambda e: e["status"] in terminal, 60)
            except TimeoutError:
                lost += 1
                continue
            to_running.append(t_run - t0)
            model_load.append(t_step - t_run)
            cancel.append(t_end - t_c)
        # Job overhead: size a job to about job_seconds of steps from the measured step time.
        step_s = _step_seconds(events)
        steps = max(5, int(job_seconds / max(step_s, 1e-3)))
        # Two turns per trajectory, 5% holdout: sample_size that gives `steps` steps.
        size = max(16, int(steps * ts.batch_size / 2 / 0.95))
        req = fill_request(
            {"training_config": {"base_model": "tiny", "dataset": {"sample_size": size}}}, ts
        )
        await bus.publish(req)
        overhead = None
        try:
            t_run, _ = await wait(req.training_job_id, lambda e: e["status"] == "running", 60)
            t_end, ev = await wait(
                req.training_job_id, lambda e: e["status"] in terminal, job_seconds * 4 + 300
            )
            wall = t_end - t_run
            train = float((ev.get("resource_usage") or {}).get("train_step_seconds") or 0.0)
            overhead = {
                "wall_s": wall,
                "train_s": train,
                "fraction": (wall - train) / wall,
                "status": ev["status"],
                "steps": (ev.get("progress") or {}).get("current_step"),
                "parts": job_parts(service.root / "jobs" / req.training_job_id / "events.jsonl"),
                "dataset": job_dataset(
                    service.root / "jobs" / req.training_job_id / "events.jsonl"
                ),
            }
            if ev["status"] != "completed":
                lost += 1
        except TimeoutError:
            lost += 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await sub.unsubscribe()
    return {
        "to_running": to_running,
        "model_load": model_load,
        "cancel": cancel,
        "overhead": overhead,
        "lost": lost,
        "step_s": step_s,
    }


def job_parts(events_file: Path) -> dict[str, float]:
    """What a dataset job's wall time was made of, from its own events (`events.jsonl`):
    data (read, parse, join, filter, sample), model (load, samples, holdout base scores),
    steps (inside trainer steps), between_steps (progress events, checkpoints), end
    (holdout estimate, final checkpoint, curves). {} when the file is missing."""
    try:
        rows = [json.loads(line) for line in events_file.read_text().splitlines()]
    except OSError:
        return {}
    marks: dict[str, float] = {}
    train_s = 0.0
    for r in rows:
        phase, t = r.get("phase"), float(r["t"])
        if r["status"] == "running" and phase and phase not in marks:
            marks[phase] = t
        if r["status"] in ("completed", "failed", "cancelled"):
            marks["end"] = t
        train_s = float(r.get("train_s") or train_s)
        if r["status"] == "running" and (r.get("progress") or {}).get("current_step"):
            marks["last_step"] = t
    need = ("loading data", "loading model", "training", "last_step", "end")
    if not all(k in marks for k in need):
        return {}
    return {
        "data_s": marks["loading model"] - marks["loading data"],
        "model_s": marks["training"] - marks["loading model"],
        "steps_s": train_s,
        "between_steps_s": marks["last_step"] - marks["training"] - train_s,
        "end_s": marks["end"] - marks["last_step"],
    }


def job_dataset(events_file: Path) -> dict[str, Any]:
    """The job's dataset report (what it read, sampled, filtered), {} when missing."""
    try:
        rows = [json.loads(line) for line in events_file.read_text().splitlines()]
    except OSError:
        return {}
    for r in rows:
        if isinstance(r.get("dataset"), dict):
            return {**r["dataset"], "load_data_s": r.get("load_data_s")}
    return {}


def _step_seconds(events: list[tuple[float, dict[str, Any]]]) -> float:
    vals = []
    for _, e in events:
        usage = e.get("resource_usage") or {}
        step = (e.get("progress") or {}).get("current_step") or 0
        if step and usage.get("train_step_seconds"):
            vals.append(usage["train_step_seconds"] / step)
    return statistics.median(vals) if vals else 1.0


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def _main(trajectories: int, jobs: int, job_seconds: float) -> dict[str, Any]:
    from agentrl.bus import Bus, EmbeddedNats
    from agentrl.core.settings import Settings

    with tempfile.TemporaryDirectory(prefix="agentrl-bench-training-") as tmp:
        server = EmbeddedNats(data_dir=Path(tmp) / "nats")
        server.start()
        try:
            settings = Settings(data_dir=Path(tmp) / "data", nats_url=server.url)
            bus = await Bus.connect(server.url, settings=settings)
            await bus.ensure_streams()
            ds = await bench_dataset(bus, trajectories)
            jb = await bench_jobs(bus, settings, jobs, job_seconds)
            await bus.close()
        finally:
            server.stop()
    return {"dataset": ds, "jobs": jb}


def run_bench(trajectories: int, jobs: int, job_seconds: float) -> None:
    import os

    out = asyncio.run(_main(trajectories, jobs, job_seconds))
    ds, jb = out["dataset"], out["jobs"]
    ov = jb["overhead"] or {}
    table = Table(title=f"agentrl bench training (load {os.getloadavg()[0]:.2f})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("target")
    table.add_row(
        "trajectories loaded / samples built",
        f"{ds['trajectories']:,.0f} / {ds['samples']:,.0f}",
        "",
    )
    table.add_row("  read from JetStream s", f"{ds['read_s']:.2f}", "")
    table.add_row("  parse+join+filter+sample s", f"{ds['load_s']:.2f}", "")
    table.add_row("  samples (advantages, token ids) s", f"{ds['build_s']:.2f}", "")
    table.add_row("dataset end to end traj/s", f"{ds['end_to_end_rate']:,.0f}", ">= 10,000")
    table.add_row("  CPU of this process s", f"{ds['cpu_s']:.2f}", "")
    p50 = _pct(jb["to_running"], 0.5)
    table.add_row("request -> running p50 s", f"{p50:.3f}" if p50 is not None else "-", "<= 1")
    ml = _pct(jb["model_load"], 0.5)
    table.add_row("running -> first step p50 s (model load)", f"{ml:.2f}" if ml else "-", "")
    c99 = _pct(jb["cancel"], 0.99)
    table.add_row("cancel -> cancelled p99 s", f"{c99:.3f}" if c99 is not None else "-", "<= 5")
    table.add_row("tiny step s", f"{jb['step_s']:.3f}", "")
    if ov:
        table.add_row(
            "overhead job wall / in steps s", f"{ov['wall_s']:.1f} / {ov['train_s']:.1f}", ""
        )
        table.add_row("job overhead fraction", f"{ov['fraction']:.3f}", "<= 0.10")
        for name, value in (ov.get("parts") or {}).items():
            table.add_row(f"  overhead job {name.removesuffix('_s')} s", f"{value:.2f}", "")
    table.add_row("lost", str(jb["lost"]), "0")
    Console().print(table)
    print(
        json.dumps(
            {
                "dataset_trajectories_per_s": round(ds["end_to_end_rate"], 1),
                "request_to_running_p50_s": None if p50 is None else round(p50, 4),
                "cancel_p99_s": None if c99 is None else round(c99, 4),
                "job_overhead_fraction": round(ov["fraction"], 4) if ov else None,
                "job_seconds_in_steps": round(ov["train_s"], 2) if ov else None,
                "job_parts_s": {k: round(v, 2) for k, v in (ov.get("parts") or {}).items()},
                "job_sample": {
                    k: (ov.get("dataset") or {}).get(k)
                    for k in ("trajectories", "sampled", "payloads_read", "load_data_s")
                },
                "dataset_cpu_s": round(ds["cpu_s"], 2),
                "lost": jb["lost"],
            }
        )
    )


def command(cfg: TrainingBench) -> None:
    """`agentrl bench training`."""
    run_bench(trajectories=cfg.trajectories, jobs=cfg.jobs, job_seconds=cfg.job_seconds)
