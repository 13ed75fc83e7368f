"""`agentrl bench rewards`: trajectories in, rewards out, through the running reward service.

Each phase gets a fresh embedded nats-server and starts the service as its own process
(`agentrl rewards serve`), as `agentrl up` would. The benchmark process publishes trajectories
(pipelined, with PubAcks) and listens for rewards on a plain subscription (arrival time per
trajectory); at the end it reads the RL_REWARDS stream back to count what was stored: `lost`
is trajectories without a reward, `duplicates` stored rewards beyond one per reward id.

Phases: trajectories without code (10% carry PII to redact), trajectories with code (ruff +
bandit), and the peer: a minimal raw nats-py service that validates nothing and answers each
trajectory with a fixed reward, i.e. the ceiling of a Python consumer on this bus and machine.
Latency is measured in a second, paced part of each phase (publishing at half the measured
throughput, so queueing does not dominate) besides the saturated one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from agentrl.bus import wire
from agentrl.contracts.samples import sample_trajectory
from agentrl.contracts.subjects import REWARD, TRAJECTORY
from agentrl.rewards.options import RewardsBench

TRAJ_STREAM = "RL_TRAJECTORIES"
ECHO_DURABLE = "echo-peer"


def _payloads(n: int, code: bool, offset: int, seed: int) -> list[tuple[str, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(offset, offset + n):
        doc = sample_trajectory(i, rng=rng, code=code, pii=(i % 10 == 3))
        out.append((doc["trajectory_id"], json.dumps(doc).encode()))
    return out


def _cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process and its children (Linux /proc): the finished ones
    (ruff runs) and the live ones (the bandit worker, sync reward-function workers)."""

    def own(p: int, with_finished: bool) -> tuple[float, int]:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        if with_finished:
            ticks += int(fields[13]) + int(fields[14])
        return ticks, int(fields[1])  # (CPU ticks, parent pid)

    try:
        total, _ = own(pid, True)
    except (OSError, IndexError, ValueError):
        return float("nan")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == pid:
            continue
        try:
            ticks, parent = own(int(entry.name), True)
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            total += ticks
    return total / os.sysconf("SC_CLK_TCK")


class _Receiver:
    """Arrival time of the first reward of each trajectory (a core NATS subscription whose
    raw messages skip nats-py's per-message dispatch: the measuring process shares the two
    cores with the service it measures, so it should take as little of them as it can)."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.messages = 0
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []

    def on_raw(self, subject: bytes, data: bytes, headers: bytes | None) -> None:
        self.messages += 1
        tid = orjson.loads(data)["trajectory_id"]
        if tid not in self.first:
            self.first[tid] = time.perf_counter()
            n = len(self.first)
            for want, fut in self.waiters:
                if n >= want and not fut.done():
                    fut.set_result(None)

    async def wait_for(self, count: int, timeout: float) -> bool:
        if len(self.first) >= count:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append((count, fut))
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False


async def read_stream(
    bus: Any, stream: str, subject: str, timeout: float = 2.0
) -> list[dict[str, Any]]:
    """Every message stored in `stream` on `subject`, oldest first (read without consuming)."""
    from nats.js.api import AckPolicy, ConsumerConfig

    info = await bus.js.stream_info(stream)
    total = int(info.state.messages)
    out: list[dict[str, Any]] = []
    if total == 0:
        return out
    sub = await bus.js.pull_subscribe(
        subject,
        stream=stream,
        config=ConsumerConfig(ack_policy=AckPolicy.NONE, filter_subject=subject),
    )
    try:
        while len(out) < total:
            try:
                msgs = await sub.fetch(min(1000, total - len(out)), timeout=timeout)
            except Exception:
                break
            out.extend(json.loads(m.data) for m in msgs)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return out


async def _stored_rewards(bus: Any) -> tuple[int, int, set[str]]:
    """(messages, unique reward ids, trajectory ids) stored in RL_REWARDS."""
    docs = await read_stream(bus, "RL_REWARDS", REWARD)
    return len(docs), len({d["reward_id"] for d in docs}), {d["trajectory_id"] for d in docs}


async def _wait_consumer(
    bus: Any, durable: str, proc: subprocess.Popen[bytes], timeout: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited early with code {proc.returncode}")
        try:
            await bus.js.consumer_info(TRAJ_STREAM, durable)
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"service did not create consumer {durable!r} within {timeout}s")


async def _publish(
    bus: Any, items: list[tuple[str, bytes]], sent: dict[str, float], rate: float | None, chunk: int
) -> None:
    start = time.perf_counter()
    for k in range(0, len(items), chunk):
        part = items[k : k + chunk]
        if rate:
            due = start + k / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        now = time.perf_counter()
        for tid, _ in part:
            sent[tid] = now
        await bus.publish_many([(TRAJECTORY, data, tid) for tid, data in part])


async def _phase(
    name: str,
    service_cmd: Callable[[str, Path], list[str]],
    durable: str,
    n: int,
    code: bool,
    paced_s: float,
    url: str | None,
    progress: Callable[[str], None],
    replicas: int = 1,
) -> dict[str, Any]:
    """One phase; with `replicas` > 1 that many service processes share the durable (each
    with its own data dir and AGENTRL_REPLICA name), and CPU is summed over them."""
    from agentrl.bus import Bus, EmbeddedNats

    with tempfile.TemporaryDirectory(prefix=f"agentrl-bench-rewards-{name}-") as tmp:
        server = EmbeddedNats(data_dir=Path(tmp) / "nats") if url is None else None
        if server is not None:
            server.start()
        nats_url = url or server.url  # type: ignore[union-attr]
        procs: list[subprocess.Popen[bytes]] = []
        bus = await Bus.connect(nats_url, name=f"bench-rewards-{name}")
        try:
            await bus.ensure_streams()
            if url is not None:  # a shared server: start from empty streams
                for stream in (TRAJ_STREAM, "RL_REWARDS"):
                    await bus.js.purge_stream(stream)
            progress(f"{name}: preparing {n:,} trajectories")
            saturated = _payloads(n, code, 0, seed=1)
            receiver = _Receiver()
            await wire.subscribe(bus.nc, REWARD, sink=receiver.on_raw)
            log = open(Path(tmp) / "service.log", "wb")  # noqa: SIM115 - closed below
            for r in range(replicas):
                cmd = service_cmd(nats_url, Path(tmp) / (f"data-{r}" if replicas > 1 else "data"))
                if replicas > 1:
                    cmd = ["env", f"AGENTRL_REPLICA=replica-{r}", *cmd]
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            for proc in procs:
                await _wait_consumer(bus, durable, proc)
            if replicas > 1:  # every replica is up (its first pull request is waiting)
                await _wait_started(Path(tmp) / "service.log", replicas, procs)
            progress(f"{name}: publishing {n:,} trajectories at full speed")
            sent: dict[str, float] = {}
            cpu0 = sum(_cpu_seconds(p.pid) for p in procs)
            t0 = time.perf_counter()
            await _publish(bus, saturated, sent, None, 500)
            ok = await receiver.wait_for(n, timeout=max(120.0, n / 50))
            t1 = time.perf_counter()
            cpu1 = sum(_cpu_seconds(p.pid) for p in procs)
            got = len(receiver.first)
            throughput = got / (t1 - t0)
            lat_sat = (
                np.array([receiver.first[t] - sent[t] for t, _ in saturated if t in receiver.first])
                * 1000
            )
            # Paced part: half the measured throughput, for latency without a backlog.
            rate = max(10.0, throughput / 2)
            m = max(50, int(rate * paced_s))
            paced = _payloads(m, code, n, seed=2)
            progress(f"{name}: {m:,} more at {rate:,.0f}/s for latency")
            await _publish(bus, paced, sent, rate, max(1, int(rate / 50)))
            ok2 = await receiver.wait_for(n + m, timeout=max(60.0, m / 20))
            lat = (
                np.array([receiver.first[t] - sent[t] for t, _ in paced if t in receiver.first])
                * 1000
            )
            await asyncio.sleep(0.5)  # late duplicates would arrive now
            stored, unique, tids = await _stored_rewards(bus)
            published = {t for t, _ in saturated} | {t for t, _ in paced}
            return {
                "phase": name,
                "replicas": replicas,
                "trajectories": n + m,
                "per_s": throughput,
                "lost": len(published - tids),
                "duplicates": stored - unique,
                "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
                "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
                "paced_rate": rate,
                "p99_saturated_ms": float(np.percentile(lat_sat, 99))
                if lat_sat.size
                else float("nan"),
                "service_cpu_us": (cpu1 - cpu0) / max(got, 1) * 1e6,
                "complete": bool(ok and ok2),
            }
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            await bus.close()
            if server is not None:
                server.stop()


async def _wait_started(
    log: Path, replicas: int, procs: list[subprocess.Popen[bytes]], timeout: float = 60.0
) -> None:
    """Until every replica has logged its start (the consumer exists after the first)."""
    deadline = time.monotonic() + timeout
    while log.read_bytes().count(b"reward service started") < replicas:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a reward service replica exited early")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not all {replicas} replicas started within {timeout}s")
        await asyncio.sleep(0.1)


def _reward_service_cmd(url: str, data_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agentrl.cli",
        "rewards",
        "serve",
        "--nats-url",
        url,
        "--data-dir",
        str(data_dir),
    ]


def _reward_service_no_metrics_cmd(url: str, data_dir: Path) -> list[str]:
    """The same service with Prometheus metrics off (the overhead comparison)."""
    return ["env", "AGENTRL_METRICS_DISABLED=1", *_reward_service_cmd(url, data_dir)]


def _echo_cmd(url: str, data_dir: Path) -> list[str]:
    return [sys.executable, "-m", "agentrl.bench.rewards", "echo", url]


async def echo_service(url: str) -> None:
    """The peer: raw nats-py, pull 256, answer each trajectory with a fixed reward, ack."""
    import nats
    from nats.js.api import ConsumerConfig

    nc = await nats.connect(url, pending_size=64 * 1024 * 1024)
    js = nc.jetstream(publish_async_max_pending=4000)
    sub = await js.pull_subscribe(
        TRAJECTORY,
        durable=ECHO_DURABLE,
        stream=TRAJ_STREAM,
        config=ConsumerConfig(max_ack_pending=4096),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        try:
            msgs = await sub.fetch(256, timeout=0.5)
        except Exception:
            continue
        futs = []
        for m in msgs:
            tid = json.loads(m.data)["trajectory_id"]
            rid = f"echo-{tid}"
            body = json.dumps(
                {"reward_id": rid, "trajectory_id": tid, "total_reward": 0.5}
            ).encode()
            futs.append(await js.publish_async(REWARD, body, headers={"Nats-Msg-Id": rid}))
        await asyncio.gather(*futs)
        for m in msgs:
            await m.ack()
    await nc.drain()


def run_rewards_benchmark(
    n: int,
    n_code: int,
    url: str | None = None,
    paced_s: float = 3.0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """All phases; one result row each."""
    say = progress or (lambda _msg: None)

    async def main() -> list[dict[str, Any]]:
        rows = [
            await _phase(
                "rewards (no code)", _reward_service_cmd, "rewards", n, False, paced_s, url, say
            )
        ]
        rows.append(
            await _phase(
                "rewards (no code, metrics off)",
                _reward_service_no_metrics_cmd,
                "rewards",
                n,
                False,
                paced_s,
                url,
                say,
            )
        )
        rows.append(
            await _phase(
                "rewards (with code)",
                _reward_service_cmd,
                "rewards",
                n_code,
                True,
                paced_s,
                url,
                say,
            )
        )
        rows.append(
            await _phase(
                "peer: raw nats-py echo", _echo_cmd, ECHO_DURABLE, n, False, paced_s, url, say
            )
        )
        # the metrics comparison in ABBA order (on, off ... off, on): load drift cancels
        for label, cmd in (
            ("rewards (no code, metrics off) #2", _reward_service_no_metrics_cmd),
            ("rewards (no code) #2", _reward_service_cmd),
        ):
            rows.append(await _phase(label, cmd, "rewards", n, False, paced_s, url, say))
        return rows

    return asyncio.run(main())


def run_replicas_benchmark(
    n: int,
    replicas: int,
    url: str | None = None,
    paced_s: float = 2.0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One reward service against `replicas` of them on one durable, in ABBA order (1, N,
    N, 1) so load drift on a shared machine cancels; one result row each."""
    say = progress or (lambda _msg: None)

    async def main() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for k in (1, replicas, replicas, 1):
            label = f"rewards x{k}" + (" #2" if any(r["replicas"] == k for r in rows) else "")
            rows.append(
                await _phase(label, _reward_service_cmd, "rewards", n, False, paced_s, url, say, k)
            )
        return rows

    return asyncio.run(main())


def replica_figures(rows: list[dict[str, Any]], replicas: int, n: int) -> dict[str, Any]:
    """The JSON figures of `run_replicas_benchmark`'s rows: one service against many."""
    one = [r for r in rows if r["replicas"] == 1]
    many = [r for r in rows if r["replicas"] == replicas]

    def mean(part: list[dict[str, Any]], key: str) -> float:
        return sum(r[key] for r in part) / len(part)

    one_rate, many_rate = mean(one, "per_s"), mean(many, "per_s")
    return {
        "replicas": replicas,
        "one_replica_trajectories_per_s": round(one_rate, 1),
        "replicas_trajectories_per_s": round(many_rate, 1),
        "ratio": round(many_rate / one_rate, 3) if one_rate else None,
        "one_replica_service_cpu_us": round(mean(one, "service_cpu_us"), 1),
        "replicas_service_cpu_us": round(mean(many, "service_cpu_us"), 1),
        "lost": sum(r["lost"] for r in rows),
        "duplicates": sum(r["duplicates"] for r in rows),
        "cpu_cores": os.cpu_count() or 1,
        "shows_scale_out": False,
        "n": n,
        "complete": all(r["complete"] for r in rows),
    }


def phase_figures(rows: list[dict[str, Any]], n: int, n_code: int) -> dict[str, Any]:
    """The JSON figures of `run_rewards_benchmark`'s six rows. The metrics cost is service
    CPU per trajectory with metrics on vs off, ABBA order (wall rates on a shared machine
    move more than the effect; both are reported)."""
    plain_row, off_row, code_row, peer, off_row2, on_row2 = rows
    on_cpu = (plain_row["service_cpu_us"] + on_row2["service_cpu_us"]) / 2
    off_cpu = (off_row["service_cpu_us"] + off_row2["service_cpu_us"]) / 2
    return {
        "trajectories_per_s": round(plain_row["per_s"], 1),
        "code_trajectories_per_s": round(code_row["per_s"], 1),
        "lost": plain_row["lost"] + code_row["lost"],
        "duplicates": plain_row["duplicates"] + code_row["duplicates"],
        "p99_latency_ms": round(plain_row["p99_ms"], 1),
        "p99_latency_paced_rate_per_s": round(plain_row["paced_rate"], 1),
        "code_p99_latency_ms": round(code_row["p99_ms"], 1),
        "p99_latency_saturated_ms": round(plain_row["p99_saturated_ms"], 1),
        "service_cpu_us_per_trajectory": round(plain_row["service_cpu_us"], 1),
        "code_service_cpu_us_per_trajectory": round(code_row["service_cpu_us"], 1),
        "peer_raw_nats_py_echo_per_s": round(peer["per_s"], 1),
        "metrics_on_trajectories_per_s": round((plain_row["per_s"] + on_row2["per_s"]) / 2, 1),
        "metrics_off_trajectories_per_s": round((off_row["per_s"] + off_row2["per_s"]) / 2, 1),
        "metrics_on_service_cpu_us_per_trajectory": round(on_cpu, 1),
        "metrics_off_service_cpu_us_per_trajectory": round(off_cpu, 1),
        "metrics_overhead_fraction": round(max(0.0, on_cpu / off_cpu - 1), 4),
        "n": n,
        "n_code": n_code,
        "complete": all(r["complete"] for r in rows),
    }


if __name__ == "__main__":  # the echo peer's process: python -m agentrl.bench.rewards echo URL
    if len(sys.argv) == 3 and sys.argv[1] == "echo":
        asyncio.run(echo_service(sys.argv[2]))
    else:
        raise SystemExit("usage: python -m agentrl.bench.rewards echo NATS_URL")


def command(cfg: RewardsBench) -> None:
    """`agentrl bench rewards`: the phases (or the replicas) with a spinner, the table and
    the JSON line."""
    import os
    import sys

    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from agentrl.bench.report import report

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(message: str) -> None:
            bar.update(task, description=message)

        if cfg.replicas > 1:
            rows = run_replicas_benchmark(
                cfg.n, cfg.replicas, cfg.url, paced_s=cfg.paced_s, progress=progress
            )
        else:
            rows = run_rewards_benchmark(
                cfg.n, cfg.n_code, cfg.url, paced_s=cfg.paced_s, progress=progress
            )
    if cfg.replicas > 1:
        print(
            f"{cfg.replicas} replicas on one {os.cpu_count() or 1}-core machine share its "
            "cores: the ratio is the cost of coordination (claims in NATS KV, shared "
            "consumer), it cannot show scale-out; that needs a host per replica.",
            file=sys.stderr,
        )
        report("rewards", rows, replica_figures(rows, cfg.replicas, cfg.n))
    else:
        report("rewards", rows, phase_figures(rows, cfg.n, cfg.n_code))
