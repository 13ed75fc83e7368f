"""`agentrl bench bus`: publish N ~4 KB trajectory events with pipelined publishing, then
consume and ack them all with a durable pull consumer; raw nats-py is the peer."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from agentrl.bench.options import BusBench
from agentrl.bus import client
from agentrl.bus.client import Bus, ConsumeStats, Delivery
from agentrl.bus.server import EmbeddedNats, NatsCluster
from agentrl.contracts.reward import RewardEvent
from agentrl.contracts.trajectory import TrajectoryEvent

log = logging.getLogger(__name__)


def sample_trajectory(i: int, turns: int = 5) -> TrajectoryEvent:
    """A realistic ~4 KB trajectory: 5 turns of tool calls with outputs."""
    t0 = datetime(2025, 12, 8, 12, 0, tzinfo=UTC)
    body = "The quick brown fox jumps over the lazy dog. " * 3
    return TrajectoryEvent.model_validate(
        {
            "trajectory_id": str(uuid.UUID(int=i + 1)),
            "session_id": f"bench-session-{i % 97}",
            "agent_id": "agent-zero-main",
            "subordinate_profile": "developer",
            "start_timestamp": t0,
            "end_timestamp": t0 + timedelta(seconds=turns * 10),
            "turns": [
                {
                    "turn_id": k + 1,
                    "timestamp": t0 + timedelta(seconds=k * 10),
                    "observation": {
                        "type": "tool_result" if k else "user_message",
                        "content": body,
                    },
                    "thought_process": ["inspect the data", "run the code"],
                    "action": {
                        "type": "tool_call",
                        "tool_name": "code_exe",
                        "tool_args": {"runtime": "python", "code": f"print(sum(range({k})))"},
                        "raw_response": body[:200],
                    },
                    "result": {"success": True, "output": body[:150], "execution_time_ms": 120.0},
                }
                for k in range(turns)
            ],
            "task_context": {
                "task_id": f"task-{i % 1000}",
                "instructions": "Sum the numbers and report the result.",
                "complexity_score": 0.5,
                "domain": "coding",
            },
            "metadata": {"model": "smollm2-135m", "temperature": 0.7, "total_tokens": 900},
        }
    )


def set_instrumentation(enabled: bool) -> None:
    """The one switch for the bus's instrumentation during a bench run (counters, and the
    metrics the observability engineer attaches to them), so the bench can measure its
    cost as `metrics_overhead_fraction` by running with it on and off."""
    client.INSTRUMENTED = enabled


async def _run(url: str, n: int, chunk: int = 50_000) -> dict[str, Any]:
    bus = await Bus.connect(url, name="bench-bus")
    await bus.ensure_streams()
    await bus.js.purge_stream("RL_TRAJECTORIES")
    events = [sample_trajectory(i) for i in range(n)]
    size = len(events[0].to_json())
    _freeze_setup()

    # CPU time of this process per message: unlike msg/s, barely moved by other load.
    c0, t0 = time.process_time(), time.perf_counter()
    published = 0
    for start in range(0, n, chunk):
        acks = await bus.publish_many(events[start : start + chunk])
        published += sum(1 for a in acks if not a.duplicate)
    publish_s = time.perf_counter() - t0
    publish_cpu = time.process_time() - c0

    c0 = time.process_time()
    seen, stats, consume_s, info = await _consume_all(bus, n)
    consume_cpu = time.process_time() - c0
    raw_events = events[: min(n, 20000)]
    # Ours and the peer alternate (A, then B B A A B): on a shared machine the rate drifts by
    # 10-20 % from one second to the next, and a single ours-then-peer pair carried that
    # drift into the comparison. Each figure is the median of its three rounds.
    ours = [published / publish_s]
    peer: list[float] = []
    raw_cpu = 0.0
    for k, who in enumerate(("peer", "peer", "ours", "ours", "peer")):
        if who == "peer":
            rate, cpu = await _raw_nats_py_publish(bus, raw_events, tag=f"raw{k}-")
            peer.append(rate)
            raw_cpu += cpu
        else:
            # ids of their own: `_onoff` publishes 10,000,000-89,999,999 on the same server
            first = 200_000_000 + 1_000_000 * k
            fresh = [sample_trajectory(first + i) for i in range(len(raw_events))]
            _freeze_setup()
            ours.append(await _publish_many_objects(bus, fresh))
    raw_cpu /= len(peer)
    same_bytes = await _publish_many_preserialised(bus, raw_events)
    await bus.close()
    expected = {e.trajectory_id for e in events}
    return {
        "messages": n,
        "message_bytes": size,
        "publish_msgs_per_s": statistics.median(ours),
        "publish_rounds_msgs_per_s": [round(r) for r in ours],
        "raw_rounds_msgs_per_s": [round(r) for r in peer],
        "consume_msgs_per_s": stats.acked / consume_s,
        "published": published,
        "consumed": len(seen),
        "acked": stats.acked,
        "ack_pending_after": info.num_ack_pending,
        "lost": len(expected - seen.keys()),
        "duplicates": sum(c - 1 for c in seen.values()),
        "raw_nats_py_publish_msgs_per_s": statistics.median(peer),
        "publish_cpu_us_per_msg": publish_cpu / n * 1e6,
        "consume_cpu_us_per_msg": consume_cpu / n * 1e6,
        "raw_publish_cpu_us_per_msg": raw_cpu / len(raw_events) * 1e6,
        "publish_many_preserialised_msgs_per_s": same_bytes,
    }


def _freeze_setup() -> None:
    """Move what the bench itself holds (the CLI's imports, the events it is about to
    publish) out of the cyclic GC's reach, as `agentrl rewards serve` does with its start-up
    state: otherwise a full collection rescanning them (hundreds of thousands of objects)
    lands inside the timed consume, which measured 106-116 µs of CPU per message instead of
    63-69 µs. Messages and batches the bus itself creates are collected as before."""
    gc.collect()
    gc.freeze()


async def _onoff(url: str, n: int, rounds: int = 4) -> dict[str, Any]:
    """Instrumentation cost: publish + consume `n` messages with the bus's instrumentation
    (counters and Prometheus metrics) on and off, in ABBA order, `rounds` times each. CPU time
    of this process per message decides (wall rates on a shared machine move more than the
    effect); the fraction is median CPU on / median CPU off - 1, floored at 0."""
    from agentrl.observability import metrics as obs_metrics

    bus = await Bus.connect(url, name="bench-bus-onoff")
    await bus.ensure_streams()
    cpu: dict[bool, list[float]] = {True: [], False: []}
    rate: dict[bool, list[float]] = {True: [], False: []}
    try:
        for k in range(rounds):
            for on in (False, True) if k % 2 == 0 else (True, False):  # ABBA: drift cancels
                # fresh ids every time: the same ids would be dropped as duplicates
                first = 10_000_000 * (1 + 2 * k + on)
                events = [sample_trajectory(first + i) for i in range(n)]
                _freeze_setup()
                set_instrumentation(on)
                obs_metrics.set_enabled(on)
                await bus.js.purge_stream("RL_TRAJECTORIES")
                c0, t0 = time.process_time(), time.perf_counter()
                await bus.publish_many(events)
                publish_s = time.perf_counter() - t0
                _seen, _stats, consume_s, _info = await _consume_all(bus, n)
                cpu[on].append((time.process_time() - c0) / n)
                rate[on].append(2 * n / (publish_s + consume_s))
    finally:
        set_instrumentation(True)
        obs_metrics.set_enabled(True)
        await bus.close()
    med = lambda xs: (sorted(xs)[(len(xs) - 1) // 2] + sorted(xs)[len(xs) // 2]) / 2  # noqa: E731
    return {
        "metrics_on_msgs_per_s": med(rate[True]),
        "metrics_off_msgs_per_s": med(rate[False]),
        "metrics_on_cpu_us_per_msg": med(cpu[True]) * 1e6,
        "metrics_off_cpu_us_per_msg": med(cpu[False]) * 1e6,
        "metrics_overhead_fraction": round(max(0.0, med(cpu[True]) / med(cpu[False]) - 1), 4),
    }


async def _consume_all(
    bus: Bus, n: int, stream: str = "RL_TRAJECTORIES"
) -> tuple[dict[str, int], ConsumeStats, float, Any]:
    """Consume and ack `n` trajectories with a fresh durable consumer; the time runs until
    the last batch's acks were confirmed by the server. Returns the consumer's info read
    after it stopped (its ack-pending count must be 0)."""
    seen: dict[str, int] = {}
    stop = asyncio.Event()

    async def handle(batch: list[Delivery]) -> None:
        for d in batch:
            tid = d.event.trajectory_id
            seen[tid] = seen.get(tid, 0) + 1
        if len(seen) >= n:
            stop.set()

    durable = f"bench-{uuid.uuid4().hex[:8]}"
    stats = ConsumeStats()
    t1 = time.monotonic()
    consumer = asyncio.create_task(
        bus.consume(
            TrajectoryEvent.SUBJECT,
            durable,
            batch_handler=handle,
            batch=512,
            stop=stop,
            stats=stats,
        )
    )
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(60.0, n / 500))
    except TimeoutError:
        stop.set()
    await consumer
    consume_s = (stats.confirmed_at or time.monotonic()) - t1
    info = await bus.js.consumer_info(stream, durable)
    await bus.js.delete_consumer(stream, durable)
    return seen, stats, consume_s, info


async def _raw_nats_py_publish(
    bus: Bus, events: list[TrajectoryEvent], tag: str = "raw-"
) -> tuple[float, float]:
    """Peer: nats-py's own publish_async on pre-serialised bytes (no validation, no retry).
    Returns msg/s and the CPU seconds of the timed region (serialising is outside it).
    `tag` prefixes the Msg-Ids: each round needs its own, or the server's duplicate window
    would drop the repeats unstored."""
    await bus.js.purge_stream("RL_TRAJECTORIES")
    payloads = [(e.to_json(), tag + e.trajectory_id) for e in events]
    c0 = time.process_time()
    t0 = time.perf_counter()
    futures = [
        await bus.js.publish_async(TrajectoryEvent.SUBJECT, data, headers={"Nats-Msg-Id": mid})
        for data, mid in payloads
    ]
    await asyncio.gather(*futures)
    rate = len(payloads) / (time.perf_counter() - t0)
    cpu = time.process_time() - c0
    await bus.js.purge_stream("RL_TRAJECTORIES")
    return rate, cpu


async def _publish_many_objects(bus: Bus, events: list[TrajectoryEvent]) -> float:
    """`publish_many` of contract objects (serialised inside the timed region), as the
    first round does, into an emptied stream."""
    await bus.js.purge_stream("RL_TRAJECTORIES")
    t0 = time.perf_counter()
    await bus.publish_many(events)
    rate = len(events) / (time.perf_counter() - t0)
    await bus.js.purge_stream("RL_TRAJECTORIES")
    return rate


async def _publish_many_preserialised(bus: Bus, events: list[TrajectoryEvent]) -> float:
    """`publish_many` on the peer's own input (pre-serialised bytes, fresh ids): the wire
    path alone, like for like with the raw nats-py peer."""
    await bus.js.purge_stream("RL_TRAJECTORIES")
    items = [(e.SUBJECT, e.to_json(), "same-" + e.trajectory_id) for e in events]
    t0 = time.perf_counter()
    await bus.publish_many(items)
    rate = len(items) / (time.perf_counter() - t0)
    await bus.js.purge_stream("RL_TRAJECTORIES")
    return rate


def run_bus_benchmark(
    n: int, url: str | None = None, cluster: int = 0, failover_n: int = 20_000
) -> dict[str, Any]:
    """Run against `url`, or against a fresh embedded server in a temporary data dir; with
    `cluster`, also against a fresh `cluster`-node cluster (R3 streams) with a leader kill."""
    import tempfile

    if url:
        res = asyncio.run(_run(url, n))
        res.update(asyncio.run(_onoff(url, min(n, 10_000))))
    else:
        with (
            tempfile.TemporaryDirectory(prefix="agentrl-bench-") as tmp,
            EmbeddedNats(data_dir=tmp) as srv,
        ):
            res = asyncio.run(_run(srv.url, n))
            res.update(asyncio.run(_onoff(srv.url, min(n, 10_000))))
    if cluster:
        with (
            tempfile.TemporaryDirectory(prefix="agentrl-bench-cluster-") as tmp,
            NatsCluster(tmp, size=cluster) as nodes,
        ):
            res.update(asyncio.run(run_cluster(nodes, n, failover_n)))
    return res


async def run_cluster(
    nodes: NatsCluster, n: int, failover_n: int, kill_after: float = 0.3
) -> dict[str, Any]:
    """Publish and consume rates on streams replicated to every node, then the failover
    drill: publish `failover_n` trajectories while a consumer consumes them, SIGKILL the
    stream leader's server after `kill_after` of them, restart it, and check that every
    trajectory is stored exactly once and consumed."""
    replicas = min(3, len(nodes.nodes))
    bus = await Bus.connect(nodes.url, name="bench-cluster", publish_retries=40)
    await bus.ensure_streams(replicas=replicas)
    await bus._retry(lambda js: js.purge_stream("RL_TRAJECTORIES"))
    events = [sample_trajectory(i) for i in range(n)]
    t0 = time.perf_counter()
    acks = await bus.publish_many(events)
    publish_rate = sum(1 for a in acks if not a.duplicate) / (time.perf_counter() - t0)
    _seen, stats, consume_s, _info = await _consume_all(bus, n)
    consume_rate = stats.acked / consume_s
    await bus._retry(lambda js: js.purge_stream("RL_TRAJECTORIES"))
    drill = await failover_drill(bus, nodes, failover_n, kill_after)
    await bus.close()
    return {
        "cluster_nodes": len(nodes.nodes),
        "cluster_replicas": replicas,
        "cluster_publish_msgs_per_s": publish_rate,
        "cluster_consume_msgs_per_s": consume_rate,
        **drill,
    }


Service = Callable[[Bus, asyncio.Event], Coroutine[Any, Any, Any]]


async def failover_drill(
    bus: Bus,
    nodes: NatsCluster,
    n: int,
    kill_after: float = 0.3,
    chunk: int = 250,
    service: Service | None = None,
) -> dict[str, Any]:
    """Publish `n` fresh trajectories in chunks while they are consumed; SIGKILL the
    RL_TRAJECTORIES leader's server once `kill_after` of them are stored and the consumer
    has handled some (a service has published its first output), restart it a second
    after publishing resumed. Waiting for the consumer matters for a service: the reward
    service opens its R3 claims bucket at start, which a cluster missing a node cannot
    place, so a kill during its start measured its start-up (held until the restart, and
    by 5 s API timeouts), not its fail-over, and only on a host where the start was slow. Measures the seconds from the kill to the first
    chunk stored after it (publishing resumed) and to the first trajectory published after
    the kill being handled (consuming resumed); counts what the stream and the consumer
    lost or hold twice.

    The consumer is a plain `Bus.consume` batch handler, or `service` (e.g. the reward
    service: `service(bus, stop)` runs until `stop`), which must publish exactly one
    `agent.rl.reward.v1` per trajectory: then RL_REWARDS is audited as well.
    """
    run = uuid.uuid4().hex[:8]
    events = [
        sample_trajectory(i).model_copy(update={"trajectory_id": str(uuid.uuid4())})
        for i in range(n)
    ]
    expected = {e.trajectory_id for e in events}
    seen: dict[str, int] = {}
    marks: dict[str, float] = {}
    stop = asyncio.Event()
    consuming = asyncio.Event()  # the consumer (or the service's output) has begun
    after_kill: set[str] = set()

    async def handle(batch: list[Delivery]) -> None:
        consuming.set()
        for d in batch:
            tid = d.event.trajectory_id
            seen[tid] = seen.get(tid, 0) + 1
            if tid in after_kill and "consume_resumed" not in marks:
                marks["consume_resumed"] = time.monotonic()
        if len(seen) >= n:
            stop.set()

    stats = ConsumeStats()
    consumer: asyncio.Task[Any]
    watcher: asyncio.Task[None] | None = None
    if service is None:
        consumer = asyncio.create_task(
            bus.consume(
                TrajectoryEvent.SUBJECT,
                f"drill-{run}",
                batch_handler=handle,
                batch=256,
                ack_wait=5.0,
                stop=stop,
                stats=stats,
            )
        )
    else:
        await bus._retry(lambda js: js.purge_stream("RL_REWARDS"))
        consumer = asyncio.create_task(service(bus, stop))
        # The service's output is what shows it resumed: watch rewards as they arrive.
        watcher = asyncio.create_task(
            _watch_rewards(bus, n, after_kill, seen, marks, stop, consuming)
        )
    victim: EmbeddedNats | None = None
    t0 = time.monotonic()
    for start in range(0, n, chunk):
        if victim is None and start >= n * kill_after:
            await _until_consuming(consuming, consumer)
            info = await bus._retry(lambda js: js.stream_info("RL_TRAJECTORIES"))
            leader = info.cluster.leader if info.cluster else None
            victim = nodes.node_named(leader) if leader else nodes.nodes[0]
            after_kill.update(e.trajectory_id for e in events[start:])
            victim.kill()
            marks["kill"] = time.monotonic()
            log.info("killed stream leader %s", leader)
        await bus.publish_many(events[start : start + chunk])
        if "kill" in marks and "publish_resumed" not in marks:
            marks["publish_resumed"] = time.monotonic()
        if (
            victim is not None
            and not victim.running
            and (time.monotonic() - marks["publish_resumed"] > 1.0)
        ):
            await _restart(victim)
    publish_s = time.monotonic() - t0
    if victim is not None and not victim.running:
        await _restart(victim)
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(120.0, n / 200))
    except TimeoutError:
        stop.set()
    await consumer
    if watcher is not None:
        await watcher
    stored = await _stored_ids(bus, n)
    res: dict[str, Any] = {
        "leader_failover_s": marks["publish_resumed"] - marks["kill"] if victim else None,
        "consume_failover_s": marks.get("consume_resumed", float("nan")) - marks["kill"]
        if victim
        else None,
        "failover_messages": n,
        "failover_publish_msgs_per_s": n / publish_s,
        "cluster_lost": len(expected - seen.keys()) + len(expected - stored.keys()),
        "cluster_duplicates": sum(c - 1 for c in stored.values())
        + (sum(c - 1 for c in seen.values()) if service is not None else 0),
        "cluster_redelivered": sum(c - 1 for c in seen.values()) if service is None else None,
        "cluster_unconfirmed_ack_batches": stats.unconfirmed_batches,
    }
    if service is not None:
        res["rewarded"] = len(seen)
        res["reward_duplicates"] = sum(c - 1 for c in seen.values())
    return res


async def _until_consuming(
    consuming: asyncio.Event, consumer: asyncio.Task[Any], timeout: float = 120.0
) -> None:
    """Until the consumer has handled something; raises when it ended or never does."""
    waiter = asyncio.ensure_future(consuming.wait())
    done, _ = await asyncio.wait([waiter, consumer], timeout=timeout, return_when="FIRST_COMPLETED")
    waiter.cancel()
    if consumer in done:
        consumer.result()  # its failure, if it failed
        raise RuntimeError("the consumer ended before the drill's kill")
    if not consuming.is_set():
        raise RuntimeError(f"the consumer handled nothing within {timeout:g} s")


async def _restart(node: EmbeddedNats, timeout: float = 30.0) -> None:
    """Start a killed node again on its store, waiting without blocking the loop (and from
    the loop's thread: a server's death signal follows the thread that started it)."""
    node.launch()
    deadline = time.monotonic() + timeout
    while not node.is_ready():
        if time.monotonic() > deadline or not node.running:
            raise RuntimeError(f"{node.server_name} did not restart; see {node.log_file}")
        await asyncio.sleep(0.05)


async def _watch_rewards(
    bus: Bus,
    n: int,
    after_kill: set[str],
    rewards: dict[str, int],
    marks: dict[str, float],
    stop: asyncio.Event,
    consuming: asyncio.Event,
) -> None:
    """Count rewards per trajectory as they are stored (an ordered reader of RL_REWARDS);
    `consuming` is set at the first; stop once every trajectory has one."""
    got = asyncio.Event()

    async def handle(batch: list[Delivery]) -> None:
        consuming.set()
        for d in batch:
            tid = d.event.trajectory_id
            rewards[tid] = rewards.get(tid, 0) + 1
            if tid in after_kill and "consume_resumed" not in marks:
                marks["consume_resumed"] = time.monotonic()
        if len(rewards) >= n:
            got.set()

    durable = f"reward-audit-{uuid.uuid4().hex[:8]}"
    task = asyncio.create_task(
        bus.consume(RewardEvent.SUBJECT, durable, batch_handler=handle, batch=512, stop=got)
    )
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait(
        [task, waiter, asyncio.create_task(got.wait())], return_when="FIRST_COMPLETED"
    )
    if got.is_set():
        await asyncio.sleep(1.0)  # a late duplicate would show up now
        stop.set()
    got.set()
    await task
    waiter.cancel()
    await bus._retry(partial(_delete_consumer, stream="RL_REWARDS", durable=durable))


async def _stored_ids(bus: Bus, n: int) -> dict[str, int]:
    """Every trajectory id the stream holds, with how often (a fresh consumer reads it)."""
    stored: dict[str, int] = {}
    stop = asyncio.Event()
    info = await bus._retry(lambda js: js.stream_info("RL_TRAJECTORIES"))
    total = info.state.messages

    async def handle(batch: list[Delivery]) -> None:
        for d in batch:
            tid = d.event.trajectory_id
            stored[tid] = stored.get(tid, 0) + 1
        if sum(stored.values()) >= total:
            stop.set()

    durable = f"audit-{uuid.uuid4().hex[:8]}"
    task = asyncio.create_task(
        bus.consume(TrajectoryEvent.SUBJECT, durable, batch_handler=handle, batch=512, stop=stop)
    )
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(60.0, n / 500))
    except TimeoutError:
        stop.set()
    await task
    await bus._retry(partial(_delete_consumer, stream="RL_TRAJECTORIES", durable=durable))
    return stored


def command(cfg: BusBench) -> None:
    """`agentrl bench bus`: the run, its table and its JSON line."""
    from agentrl.bench.report import report

    cluster = cfg.cluster or 0
    res = run_bus_benchmark(cfg.n, cfg.url, cluster=cluster, failover_n=cfg.failover_n)
    rows = [
        {
            "path": "agentrl Bus.publish_many (contract objects, serialised), median of "
            f"3 rounds {res['publish_rounds_msgs_per_s']}",
            "msgs/s": res["publish_msgs_per_s"],
        },
        {
            "path": "raw nats-py publish_async (peer), median of 3 rounds "
            f"{res['raw_rounds_msgs_per_s']} (order: ours, peer, peer, ours, ours, peer)",
            "msgs/s": res["raw_nats_py_publish_msgs_per_s"],
        },
        {
            "path": "agentrl Bus.publish_many on the same pre-serialised bytes",
            "msgs/s": res["publish_many_preserialised_msgs_per_s"],
        },
        {"path": "agentrl Bus.consume + ack", "msgs/s": res["consume_msgs_per_s"]},
        {
            "path": "CPU us/msg: publish_many | raw peer | consume",
            "msgs/s": f"{res['publish_cpu_us_per_msg']:.1f} | "
            f"{res['raw_publish_cpu_us_per_msg']:.1f} | {res['consume_cpu_us_per_msg']:.1f}",
        },
    ]
    rows.append(
        {
            "path": "metrics on | off: msgs/s (publish+consume), CPU us/msg",
            "msgs/s": f"{res['metrics_on_msgs_per_s']:,.0f} | {res['metrics_off_msgs_per_s']:,.0f}"
            f", {res['metrics_on_cpu_us_per_msg']:.1f} | {res['metrics_off_cpu_us_per_msg']:.1f}"
            f" (overhead {res['metrics_overhead_fraction']:.1%})",
        }
    )
    if cluster:
        rows += [
            {
                "path": f"cluster x{cluster} R3 publish_many",
                "msgs/s": res["cluster_publish_msgs_per_s"],
            },
            {
                "path": f"cluster x{cluster} R3 consume + ack",
                "msgs/s": res["cluster_consume_msgs_per_s"],
            },
            {
                "path": "leader SIGKILL -> publishing resumed (s)",
                "msgs/s": res["leader_failover_s"],
            },
            {
                "path": "leader SIGKILL -> consuming resumed (s)",
                "msgs/s": res["consume_failover_s"],
            },
            {
                "path": "consumer redeliveries in the drill",
                "msgs/s": res["cluster_redelivered"],
            },
        ]
    keys = [
        "messages",
        "message_bytes",
        "publish_msgs_per_s",
        "consume_msgs_per_s",
        "published",
        "consumed",
        "acked",
        "ack_pending_after",
        "lost",
        "duplicates",
        "raw_nats_py_publish_msgs_per_s",
        "publish_rounds_msgs_per_s",
        "raw_rounds_msgs_per_s",
        "metrics_on_msgs_per_s",
        "metrics_off_msgs_per_s",
        "metrics_overhead_fraction",
    ]
    if cluster:
        keys += [
            "cluster_publish_msgs_per_s",
            "cluster_consume_msgs_per_s",
            "leader_failover_s",
            "cluster_lost",
            "cluster_duplicates",
        ]
    report("bus", rows, {k: res[k] for k in keys})


async def _delete_consumer(js: Any, stream: str, durable: str) -> None:
    """Delete a consumer; one already gone was deleted by a try that was answered late."""
    import nats.js.errors

    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_consumer(stream, durable)
