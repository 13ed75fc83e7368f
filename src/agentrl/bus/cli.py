"""`agentrl up` and `agentrl bench bus`."""

from __future__ import annotations

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    @app.command()
    def up(
        data_dir: str = typer.Option(
            None, help="Data dir (default AGENTRL_DATA_DIR or ./.agentrl)."
        ),
        port: int = typer.Option(0, help="NATS port; 0 picks a free one."),
        no_services: bool = typer.Option(False, help="Only the NATS server and its streams."),
        cluster: int = typer.Option(
            0,
            help="Start a JetStream cluster of this many nats-servers on loopback (e.g. 3) "
            "with streams replicated min(3, N) times, instead of one server.",
        ),
        replicas: int = typer.Option(
            1,
            min=1,
            help="Run this many of every service on this machine (replica i: its own "
            "processes, AGENTRL_REPLICA_ID=replica-i, API and gateway at the base port + i).",
        ),
    ) -> None:
        """Start the whole embedded stack: nats-server with JetStream and all streams,
        the reward service, the warehouse ingester, the training service with its
        triggers, the deployment controller with the OpenAI-compatible gateway, and
        the control API with /metrics and /health; each service supervised
        (restarted with backoff). It prints every URL it serves and shows a live
        status panel. Ctrl-C stops everything cleanly.

        \b
        Ports: AGENTRL_API_PORT (8600), AGENTRL_GATEWAY_PORT (8700), loopback.
        --data-dir keeps several stacks apart (give each its own ports).

        \b
        An OpenAI client: one model name, split across the versions; the
        response's `model` names the version that answered.
          from openai import OpenAI
          client = OpenAI(base_url="http://127.0.0.1:8700/v1", api_key="x")
          client.chat.completions.create(
              model="agentrl-policy", messages=[...])
        AGENTRL_DEPLOY_API_KEYS='["k"]' requires keys; the header x-session-id
        keeps a session on one version; extra_body={"guided_choice": [...]}
        answers with one of the choices.

        \b
        Agent Zero: `agentrl agent-zero install PATH_TO_AGENT_ZERO` copies the
        plugin and prints the chat model settings: provider OpenAI-compatible
        ("other"), model "agentrl-policy", API base http://127.0.0.1:8700/v1.
        Its trajectories then flow to NATS_URL (printed below) and train the
        next version.
        """
        from agentrl.observability.multiproc import enable_for_stack
        from agentrl.stack import run_stack

        enable_for_stack(data_dir)  # job child processes report to the one /metrics

        if cluster:
            _up_cluster(cluster, data_dir, not no_services, replicas)
            return
        run_stack(data_dir=data_dir, port=port or None, services=not no_services, replicas=replicas)

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


def _up_cluster(size: int, data_dir: str | None, services: bool, replicas: int = 1) -> None:
    """`agentrl up --cluster N`: N local nats-servers, NATS_URL pointing at all of them and
    AGENTRL_STREAM_REPLICAS=min(3, N), then the usual stack against them."""
    import os
    from pathlib import Path

    from agentrl.bus.server import NatsCluster
    from agentrl.settings import get_settings
    from agentrl.stack import run_stack

    base = Path(data_dir) if data_dir else get_settings().data_dir
    with NatsCluster(base / "cluster", size=size) as nodes:
        os.environ["NATS_URL"] = nodes.url
        os.environ["AGENTRL_STREAM_REPLICAS"] = str(min(3, size))
        get_settings.cache_clear()
        print(f"nats cluster of {size} servers, JetStream store under {base / 'cluster'}")
        for node in nodes.nodes:
            print(f"  {node.server_name} listening on {node.url}  log: {node.log_file}")
        run_stack(data_dir=data_dir, services=services, replicas=replicas)
