"""`agentrl bench bus` (`agentrl up` is the app's: `agentrl.app.cli`)."""

from __future__ import annotations

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @bench.command("bus")
    def bench_bus(
        quick: bool = typer.Option(False, "--quick", help="20,000 messages instead of 100,000."),
        n: int = typer.Option(0, help="Number of messages (overrides --quick)."),
        url: str = typer.Option(
            None, help="Benchmark an existing server instead of the embedded one."
        ),
        cluster: int = typer.Option(
            0,
            help="Also run on a fresh cluster of this many local nats-servers (3): R3 "
            "publish/consume rates and a stream-leader SIGKILL while publishing.",
        ),
        failover_n: int = typer.Option(
            20_000, help="Trajectories published during the leader-kill drill."
        ),
    ) -> None:
        """Publish N ~4 KB trajectory events (pipelined, with PubAcks and de-duplication ids),
        then consume and ack them with a durable pull consumer (acks confirmed). Targets on 2
        cores: publish >= raw nats-py publish_async in the same run, consume+ack >= 10,000
        msg/s, ack_pending_after 0, nothing lost or duplicated. With --cluster 3: R3 rates
        and the seconds from a stream-leader SIGKILL to publishing resumed."""
        from agentrl.benchmarks.report import report
        from agentrl.bus.bench import run_bus_benchmark

        count = n or (20_000 if quick else 100_000)
        res = run_bus_benchmark(count, url, cluster=cluster, failover_n=failover_n)
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
