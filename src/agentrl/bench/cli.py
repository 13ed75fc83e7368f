"""Every `agentrl bench NAME` and `agentrl soak`: the benchmarks' commands, drawn here so a
package's own cli knows nothing of its benchmarks. The figures come from the benchmark modules
beside this one (`agentrl.bench.<name>`); their options from the packages' option models.
Heavy imports stay inside the commands, so `agentrl --help` stays fast."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import typer

from agentrl.app.cli import _show_config_option
from agentrl.core.configcli import config_command
from agentrl.evaluation.options import FreeformBench, LearningBench, TrainerBench
from agentrl.offpolicy.cli import RUN_FLAGS
from agentrl.offpolicy.options import DqnBench, PerBench
from agentrl.rewards.options import RedactionBench, RewardsBench
from agentrl.training.options import TrainingBench
from agentrl.warehouse.options import WarehouseBench

HELP = (
    "Benchmarks. Each prints a readable table and, as its last line, one JSON object of "
    "named figures (record them in BENCHMARKS.md)."
)


def register(app: typer.Typer) -> None:
    """`agentrl bench` with its commands in the order `agentrl bench --help` lists them, and
    `agentrl soak`."""
    bench = typer.Typer(help=HELP, no_args_is_help=True)
    app.add_typer(bench, name="bench")
    _register_bus(bench)
    bench.command("redaction")(config_command(RedactionBench, ("n",), _bench_redaction))
    fields = ("n", "n_code", "url", "replicas")
    bench.command("rewards")(config_command(RewardsBench, fields, _bench_rewards))
    _register_gigpo(bench)
    _register_rollout(bench)
    bench.command("trainer")(
        config_command(TrainerBench, list(TrainerBench.model_fields), _bench_trainer)
    )
    learning = list(LearningBench.model_fields)
    bench.command("learning")(config_command(LearningBench, learning, _bench_learning))
    freeform = list(FreeformBench.model_fields)
    bench.command("learning-freeform")(config_command(FreeformBench, freeform, _bench_freeform))
    dqn = list(DqnBench.model_fields)
    bench.command("dqn")(config_command(DqnBench, dqn, _bench_dqn, flags=RUN_FLAGS))
    bench.command("per")(config_command(PerBench, list(PerBench.model_fields), _bench_per))
    training_fields = ("trajectories", "jobs", "job_seconds")
    bench.command("training")(config_command(TrainingBench, training_fields, _bench_training))
    bench.command("warehouse")(config_command(WarehouseBench, ("n", "repeat"), _bench_warehouse))
    _register_lineages(bench)
    _register_canary(bench)
    _register_gateway(bench)
    _register_structured(bench)
    _register_serving(bench)
    _register_metrics(bench)
    _register_soak(app)
    _register_capture(bench)
    _register_startup(bench)
    _register_choice(bench)
    _register_argparse(bench, "tooluse-job", "agentrl.bench.tooluse_job")
    _register_argparse(bench, "tooluse-hints", "agentrl.bench.tooluse_hints")


def _register_bus(bench: typer.Typer) -> None:
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
        from agentrl.bench.bus import run_bus_benchmark
        from agentrl.bench.report import report

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


def _bench_redaction(cfg: RedactionBench) -> None:
    """PII redaction: precision and recall on the labelled corpus (agentrl.rewards.pii_corpus,
    207 hand-written strings, about half of them near-misses), and the cost of redacting at the
    edge (`redact_event`, what producers call before publishing) per trajectory in µs."""
    from agentrl.bench.redaction import edge_cost, score_corpus
    from agentrl.bench.report import report

    scores = score_corpus()
    cost = edge_cost(cfg.n)
    rows: list[dict[str, Any]] = [
        {"kind": kind, "positives": v["positives"], "recall": round(v["recall"], 3)}
        for kind, v in scores["per_kind"].items()
    ]
    rows.append(
        {
            "kind": "all",
            "positives": scores["positives"],
            "recall": round(scores["recall"], 3),
            "precision": round(scores["precision"], 3),
            "false_positives": scores["false_positives"],
        }
    )
    for miss in scores["misses"]:
        typer.echo(f"missed: {miss!r}", err=True)
    for alarm in scores["false_alarms"]:
        typer.echo(f"false alarm: {alarm!r}", err=True)
    figures = {
        "precision": round(scores["precision"], 4),
        "recall": round(scores["recall"], 4),
        "corpus_strings": scores["strings"],
        "false_positives": scores["false_positives"],
        "false_negatives": scores["false_negatives"],
        "edge_redaction_us_per_trajectory": round(cost["us_per_trajectory"], 1),
        "edge_redaction_us_median": round(cost["us_per_trajectory_median"], 1),
        "edge_redaction_us_clean": round(cost["us_clean_median"], 1),
        "edge_redaction_us_with_pii": round(cost["us_with_pii_median"], 1),
    }
    report("redaction", rows, figures)


def _bench_rewards(cfg: RewardsBench) -> None:
    """End to end through the running reward service: trajectories in, rewards out.

    Publishes trajectories to the embedded NATS and counts the rewards that come back.
    Targets on 2 cores: >= 5,000 trajectories/s without code, >= 200/s with code (ruff +
    bandit), lost 0, duplicates 0. The peer is a raw nats-py service that answers every
    trajectory with a fixed reward.

    With --replicas N: one service against N replicas sharing the durable, on this
    machine, side by side. On one small machine the replicas share its cores, so the
    ratio shows the cost of coordinating them, not scale-out."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from agentrl.bench import rewards as bench
    from agentrl.bench.report import report

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(message: str) -> None:
            bar.update(task, description=message)

        if cfg.replicas > 1:
            rows = bench.run_replicas_benchmark(
                cfg.n, cfg.replicas, cfg.url, paced_s=cfg.paced_s, progress=progress
            )
        else:
            rows = bench.run_rewards_benchmark(
                cfg.n, cfg.n_code, cfg.url, paced_s=cfg.paced_s, progress=progress
            )
    if cfg.replicas > 1:
        typer.echo(
            f"{cfg.replicas} replicas on one {os.cpu_count() or 1}-core machine share its "
            "cores: the ratio is the cost of coordination (claims in NATS KV, shared "
            "consumer), it cannot show scale-out; that needs a host per replica.",
            err=True,
        )
        report("rewards", rows, bench.replica_figures(rows, cfg.replicas, cfg.n))
    else:
        report("rewards", rows, bench.phase_figures(rows, cfg.n, cfg.n_code))


def _register_gigpo(bench: typer.Typer) -> None:
    @bench.command("gigpo")
    def bench_gigpo(
        sizes: str = typer.Option(
            "10000,100000,1000000", help="Comma-separated batch sizes in step rows."
        ),
        repeats: int = typer.Option(5, help="Timed runs per size; the best is reported."),
        peer_max_rows: int = typer.Option(
            1_000_000,
            help="Largest batch the dictionary peer is timed on (about 2-5 s per million rows).",
        ),
        seed: int = typer.Option(0, help="Seed of the synthetic batch."),
    ) -> None:
        """Time GiGPO advantages on synthetic gridworld batches against a dictionary peer.

        Batches: groups of 8 episodes of 1-15 steps walking a 6x6 room, anchors as fresh
        strings (rendered grids), so anchor groups recur as in real training.

        The peer computes the same advantages the way verl-agent does (dictionaries of ids,
        loops over rows); the table shows both times, the speedup and the largest difference.
        Goal: 100k rows in under 50 ms on one core.
        """
        import os

        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        from agentrl.bench.gigpo import run_gigpo_benchmark

        run_gigpo_benchmark(
            [int(s) for s in sizes.split(",") if s.strip()],
            repeats=repeats,
            peer_max_rows=peer_max_rows,
            seed=seed,
        )


def _register_rollout(bench: typer.Typer) -> None:
    @bench.command("rollout")
    def bench_rollout(
        env: str = typer.Option("sokoban", help="Environment id for agentrl.envs.make_env."),
        group: int = typer.Option(8, help="Episodes per group (run concurrently)."),
        steps: int = typer.Option(10, help="Steps per episode (the random model never solves it)."),
        max_new_tokens: int = typer.Option(
            32, help="Tokens generated per action (a short think-then-act answer)."
        ),
        history_window: int = typer.Option(
            2, help="Past turns in each prompt (-1 = all); longer prompts cost more per call."
        ),
        repeats: int = typer.Option(3, help="Timed groups per mode; the fastest is reported."),
        seed: int = typer.Option(0, help="Seed of the level and of the model's weights."),
        threads: int = typer.Option(
            1,
            help="torch threads (0 = torch's default). One by default: on a shared machine "
            "extra threads wait on each other and make the timing noise, not the speed.",
        ),
    ) -> None:
        """Environment steps per second of a GiGPO group of episodes driven by a local model
        (a tiny random Llama with SmolLM2's tokenizer), generating for all episodes in one
        batched generation versus one episode at a time, and batched without sharing the
        group's common prompt prefix. Same task, seed and episode length for all; the last
        line is JSON with `batched_speedup` (goal >= 4).
        """
        from agentrl.bench.rollout import run_rollout_benchmark

        run_rollout_benchmark(
            env_id=env,
            group=group,
            steps=steps,
            max_new_tokens=max_new_tokens,
            history_window=None if history_window < 0 else history_window,
            repeats=repeats,
            seed=seed,
            threads=threads or None,
        )


def _bench_trainer(cfg: TrainerBench) -> None:
    """Tokens/s of one policy-gradient update (forward, backward, clip, AdamW) on 8
    sequences of 100 prompt + 32 action tokens: ours vs TRL's GRPOTrainer loss vs a plain
    PyTorch loop with the LM head on action positions only (the ceiling). Timed in turns
    so machine load hits all three alike."""
    import torch
    from rich.console import Console

    from agentrl.bench.report import report
    from agentrl.evaluation.trainer import CASES, run_trainer_benchmark

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    console = Console(stderr=True)
    names = [c.strip() for c in cfg.cases.split(",") if c.strip()]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise typer.BadParameter(f"unknown cases {unknown}; choose from {sorted(CASES)}")
    rows, figures = run_trainer_benchmark(
        [CASES[c] for c in names],
        warmup=cfg.warmup,
        rounds=cfg.rounds,
        progress=lambda m: console.log(m),
    )
    figures["torch_threads"] = torch.get_num_threads()
    report("trainer: policy-gradient update tokens/s", rows, figures)


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _bench_learning(cfg: LearningBench) -> None:
    """GiGPO vs GRPO vs RLOO at equal episode budgets, >= 5 seeds: FrozenLake 4x4 (`agentrl
    learn`'s configuration: base/trained held-out success, seconds to 0.7), a
    curriculum (6x6 maps from each seed's 4x4 adapter) and one-box Sokoban. Final
    held-out success with 95 % intervals (t over seeds, pooled Wilson), wall and CPU
    seconds to 0.5 and 0.7, a PNG per setting. One line per iteration on stderr; the
    last stdout line is one JSON object (base_success, trained_success, seconds_to_070,
    gigpo/grpo/rloo_final_success, gigpo/grpo_seconds_to_050, gigpo/grpo_ci_low/high,
    seeds, wall_s, then extras: cpu_s, load, sokoban_*)."""
    if cfg.settings.strip() == "tooluse":  # Agent Zero JSON tool use: agentrl.learners.tooluse
        _learning_tooluse(cfg)
        return
    from rich.console import Console
    from rich.table import Table

    from agentrl.evaluation import compare as bc

    plan = _learning_plan(cfg)
    if cfg.collect_only:
        runs = bc.load_runs(cfg.out / "runs.jsonl")
        cost = {"wall_s": 0.0, "cpu_s": 0.0, "load_start": bc.load1(), "load_end": bc.load1()}
    else:
        _say(f"bench learning: {plan.seeds} seeds, settings {plan.settings}, jobs {cfg.jobs}")
        runs, cost = bc.run_plan(plan, cfg.jobs, _say)
    rows = bc.table_rows(runs, plan)
    table = Table(title=f"bench learning: held-out greedy success, {plan.seeds} seeds")
    for col in rows[0] if rows else []:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console = Console(stderr=True, width=220)
    console.print(table)
    png = bc.plot(runs, plan, cfg.out / "learning_compare.png") if runs else None
    line = bc.last_line(runs, cost, plan, cfg.jobs)
    summary = {"line": line, "rows": rows, "png": str(png) if png else None}
    (cfg.out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    console.print(
        f"wall {cost['wall_s']:.0f}s, cpu {cost['cpu_s']:.0f}s, load "
        f"{cost['load_start']:.2f} -> {cost['load_end']:.2f}; curves: {png}"
    )
    print(json.dumps(line), flush=True)


def _learning_plan(cfg: LearningBench) -> Any:
    """The comparison's plan: the quick or the recorded one, with the options over it."""
    from agentrl.evaluation import compare as bc

    if cfg.quick:
        plan = bc.quick_plan(str(cfg.config), str(cfg.out))
    else:
        plan = bc.full_plan(str(cfg.config), cfg.seeds, str(cfg.out), threads=cfg.threads or 0)
    plan.settings = tuple(s.strip() for s in cfg.settings.split(",") if s.strip())
    plan.reuse = cfg.reuse
    plan.fl4_every_algorithm = cfg.fl4_every_algorithm
    plan.algorithms = tuple(a.strip() for a in cfg.algorithms.split(",") if a.strip())
    bad = set(plan.settings) - set(bc.SETTINGS) or set(plan.algorithms) - set(bc.ALGORITHMS)
    if bad:
        raise typer.BadParameter(f"unknown setting or algorithm: {sorted(bad)}")
    if cfg.model:
        plan.overrides.setdefault("all", {})["model"] = cfg.model
    if cfg.iterations_scale != 1.0:
        for name in bc.SETTINGS:
            base = plan.config(name, "gigpo", 0).iterations
            plan.overrides.setdefault(name, {})["iterations"] = max(
                1, round(base * cfg.iterations_scale)
            )
    return plan


def _learning_tooluse(cfg: LearningBench) -> None:
    from pathlib import Path

    from agentrl.evaluation.tooluse import bench_tooluse
    from agentrl.llm.config import is_tooluse_config

    config = cfg.config if is_tooluse_config(cfg.config) else Path("configs/tooluse-rl.yaml")
    extra: dict[str, object] = {"model": cfg.model} if cfg.model else {}
    if cfg.quick:
        extra.update(model="tiny", heldout_per_family=2, warm_tasks_per_family=2)
        extra.update(iterations=1, tasks_per_iteration=3, group_size=2)
        extra.update(max_new_tokens=24, max_steps=2, warm_epochs=1)
    pooled = bench_tooluse(config, cfg.seeds, cfg.out, _say, **extra)
    print(json.dumps(pooled), flush=True)


def _bench_freeform(cfg: FreeformBench) -> None:
    """GiGPO vs GRPO with equal episode budgets on text FrozenLake and Sokoban: success
    rate per iteration (mean over seeds) for each, as a PNG and JSON. Budgets are small on
    CPU; the figures say what was measured, not what a GPU run would reach."""
    from agentrl.bench.report import report
    from agentrl.evaluation.learning import run_learning_benchmark

    kw = cfg.model_dump(exclude={"envs", "out"})
    envs = [e.strip() for e in cfg.envs.split(",") if e.strip()]
    rows, figures = run_learning_benchmark(envs=envs, out_dir=cfg.out, **kw)
    report("learning: GiGPO vs GRPO", rows, figures)


def _bench_dqn(cfg: DqnBench) -> None:
    """CartPole-v1: our Double DQN + PER, with and without smoothing + early stop, and SB3 DQN.

    Measures env steps and wall seconds until a greedy 10-episode evaluation first
    averages >= 475, steps per second, area under the learning curve, TD-error
    variance, and for (b) where early stopping fired. Last line: JSON figures
    (ours_wall_s_to_475, sb3_wall_s_to_475, ratio_vs_sb3, ours_steps_to_475, solved_seeds).
    """
    from rich.console import Console

    from agentrl.bench.dqn import RunFigures, bench_dqn
    from agentrl.bench.report import report

    console = Console()

    def on_run(r: RunFigures) -> None:
        solved = (
            f"solved at {r.solved_step} steps / {r.solved_wall_s:.1f}s"
            if r.solved_step
            else "not solved"
        )
        console.print(
            f"  seed {r.seed} {r.agent}: {solved}; ran {r.env_steps} steps in {r.wall_s:.1f}s"
        )

    with console.status("running agents..."):
        rows, figures = bench_dqn(
            cfg.config, seeds=cfg.seeds, quick=cfg.quick, with_sb3=cfg.sb3, on_run=on_run
        )
    report("offpolicy-dqn-cartpole", rows, figures, Console(width=max(console.width, 160)))


def _bench_per(cfg: PerBench) -> None:
    """Prioritized replay: one sample + priority update of a batch from a full memory (goal <= 0.3 ms)."""
    from rich.console import Console

    from agentrl.bench.dqn import bench_per
    from agentrl.bench.report import report

    console = Console()
    with console.status("filling the memory and timing..."):
        rows, figures = bench_per(cfg.capacity, cfg.batch, cfg.iters)
    report("offpolicy-per", rows, figures, Console(width=max(console.width, 120)))


def _bench_training(cfg: TrainingBench) -> None:
    """Dataset loading rate, request->running and cancel latencies, job overhead."""
    from agentrl.bench.training import run_bench

    run_bench(trajectories=cfg.trajectories, jobs=cfg.jobs, job_seconds=cfg.job_seconds)


def _bench_warehouse(cfg: WarehouseBench) -> None:
    """Ingest from JetStream into chdb (>= 20,000 turns/s), analytics queries on
    1,000,000 turns (p50 < 200 ms, p99 < 1 s), export of 100,000 filtered trajectories
    to Parquet (< 2 s). Last line: turns_per_s, query_p50_ms, query_p99_ms, export_s, lost."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from agentrl.bench import warehouse as bench
    from agentrl.bench.report import report

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task("starting", total=None)
        rows, figs = bench.run(
            cfg.n,
            cfg.trajectories,
            cfg.repeat,
            progress=lambda m: bar.update(task, description=m),
        )
    report("warehouse", bench.report_rows(rows, figs), bench.figures(rows, figs))


def _register_lineages(bench: typer.Typer) -> None:
    @bench.command("lineages")
    def bench_lineages(
        many: int = typer.Option(100, help="Lineages of the large run (the small one has 1)."),
        rounds: int = typer.Option(5, help="Ticks of every lineage measured."),
    ) -> None:
        """One controller tick per lineage with 1 lineage and with MANY (registry and
        controllers on a real nats-server): one JSON line."""
        from agentrl.bench.lineages import run_bench

        run_bench(many=many, rounds=rounds)


def _register_canary(bench: typer.Typer) -> None:
    @bench.command("canary")
    def bench_canary(
        runs: int = typer.Option(200, help="Rollouts of a canary identical to live."),
        worse_runs: int = typer.Option(100, help="Rollouts of a canary 0.3 worse."),
        cap: int = typer.Option(8000, help="Trajectories per rollout before it counts as held."),
        batch: int = typer.Option(200, help="Trajectories between two looks of the monitor."),
        small_runs: int = typer.Option(200, help="Small deployment: identical canaries."),
        small_worse_runs: int = typer.Option(100, help="Small deployment: 0.3 worse."),
        small_better_runs: int = typer.Option(100, help="Small deployment: 0.3 better."),
        small_cap: int = typer.Option(2000, help="Small deployment: the deadline, episodes."),
        quick: bool = typer.Option(False, help="A smoke test: 6 + 4 shorter rollouts."),
    ) -> None:
        """False rollbacks and promoted worse canaries: sticky sessions through the real
        controller, split and monitor; and a small deployment (5 agents, sessions of 20)."""
        from agentrl.bench.canary import run_bench

        small = (small_runs, small_worse_runs, small_better_runs)
        if quick:
            runs, worse_runs, cap, small = 6, 4, 12_000, (4, 3, 3)
        run_bench(
            runs=runs,
            worse_runs=worse_runs,
            cap=cap,
            batch=batch,
            small_runs=small,
            small_cap=small_cap,
        )


def _register_gateway(bench: typer.Typer) -> None:
    @bench.command("gateway")
    def bench_gateway(
        duration: float = typer.Option(3.0, help="Seconds of load per request rate."),
        model: str = typer.Option("tiny", help="Local model for the batching figure."),
        tokens: int = typer.Option(32, help="Completion tokens per request (batching)."),
        period: float = typer.Option(2.0, help="Monitor period for the rollback figure."),
        latency_only: bool = typer.Option(False, help="Only the added-latency figures."),
        repeat: int = typer.Option(1, help="Latency runs per rate (the median is reported)."),
        peers: bool = typer.Option(
            False,
            help="Side by side with LiteLLM's proxy, Portkey's gateway and TensorZero's "
            "(installed once into ~/.cache/agentrl/bench-peers): added latency, max rate, CPU.",
        ),
        only: str = typer.Option(
            "litellm,portkey,tensorzero",
            help="With --peers: which peers, comma-separated; also agentrl's own gateway under "
            "another server, loop or scheduler slice: agentrl-asyncio, agentrl-granian, "
            "agentrl-granian-asyncio, agentrl-h11, agentrl-slice, agentrl-w2 and agentrl-w3 "
            "(2 or 3 gateway processes on one port: `agentrl up --gateway-workers`).",
        ),
        interleave: int = typer.Option(
            0,
            help="With --peers: agentrl and every peer started at once, then N rounds of one "
            "short non-streamed run each in turn (medians and each round's figures).",
        ),
        rates: str = typer.Option(
            "1000", help="With --interleave: request rates, comma-separated."
        ),
    ) -> None:
        """Gateway overhead, rollback time, batching factor, split accuracy."""
        if peers and interleave:
            from agentrl.bench.gateway_peers import run_interleaved

            run_interleaved(
                duration=duration,
                only=tuple(x for x in only.split(",") if x),
                rounds=interleave,
                rates=tuple(float(x) for x in rates.split(",") if x),
            )
            return
        if peers:
            from agentrl.bench.gateway_peers import run_peers

            run_peers(duration=duration, only=tuple(x for x in only.split(",") if x))
            return
        from agentrl.bench.gateway import run_bench

        run_bench(
            duration=duration,
            model=model,
            tokens=tokens,
            period=period,
            latency_only=latency_only,
            repeat=repeat,
        )


def _register_structured(bench: typer.Typer) -> None:
    @bench.command("structured")
    def bench_structured(
        model: str = typer.Option("smollm2", help="Local model: smollm2 or tiny (random)."),
        schemas: int = typer.Option(200, help="Generated JSON Schemas (one prompt each)."),
        max_tokens: int = typer.Option(160, help="Completion token cap per request."),
        batch: int = typer.Option(8, help="Max batch size of the local engine."),
        seed: int = typer.Option(0, help="Seed of the schemas and the model."),
    ) -> None:
        """Structured outputs: valid fraction, added time per token, grammar compile time."""
        from agentrl.bench.structured import print_structured_bench

        print_structured_bench(
            model=model, n_schemas=schemas, max_tokens=max_tokens, batch=batch, seed=seed
        )


def _register_serving(bench: typer.Typer) -> None:
    @bench.command("serving")
    def bench_serving(
        model: str = typer.Option("smollm2", help="Base model: smollm2, or tiny (random)."),
        prompts: int = typer.Option(256, help="Prompts, the same for both backends."),
        concurrency: str = typer.Option("1,8,32", help="Concurrency levels, comma-separated."),
        max_tokens: int = typer.Option(32, help="Completion tokens per request."),
        budget_s: float = typer.Option(
            540.0,
            help="Seconds for the whole bench: the prefix-cache part first, then vLLM's start "
            "and the load runs in what is left (the command ends within ~10 minutes on "
            "2 cores); what does not fit is listed under `skipped`. 0: no bound.",
        ),
        prefix: bool = typer.Option(
            True, help="Also measure the local engine's prefix cache on Agent Zero's prompt."
        ),
        prefix_only: bool = typer.Option(
            False, help="Only the prefix-cache figures (no vLLM, no throughput levels)."
        ),
        agent_zero_prompt: str = typer.Option(
            "", help="A file with Agent Zero's rendered system prompt (default: synthetic)."
        ),
        multilora: bool = typer.Option(
            True, help="Also measure N = 1, 4, 16 live LoRA adapters in one batch (lineages)."
        ),
        multilora_only: bool = typer.Option(
            False, help="Only the multi-LoRA figures (no prefix cache, no vLLM)."
        ),
    ) -> None:
        """The local backend and vLLM, same model, same prompts, through the gateway:
        requests/s, output tokens/s, p50/p99 latency, adapter load seconds; and the local
        engine's prefix cache on a 5,408-token Agent Zero prompt; N lineages' adapters in one
        batch (`multilora_tokens_per_s_{1,4,16}`, `adapter_mib`); one JSON line. Order: the
        multi-LoRA part, the prefix part, then vLLM and the load levels in what is left of
        the budget (what does not fit is listed under `skipped`)."""
        import asyncio
        import time

        from agentrl.bench.multilora import multilora_run
        from agentrl.bench.prefix import prefix_run
        from agentrl.bench.serving import run_bench

        out: dict[str, object] = {}
        spent = 0.0  # the multi-LoRA and prefix parts' seconds, out of the budget
        if (multilora or multilora_only) and not prefix_only:
            started = time.monotonic()
            share = budget_s / 3 if budget_s and not multilora_only else None
            out.update(asyncio.run(multilora_run(model, max_tokens=max_tokens, budget_s=share)))
            out["multilora_s"] = spent = round(time.monotonic() - started, 1)
            if multilora_only:
                typer.echo(json.dumps(out))
                return
        if prefix or prefix_only:
            started = time.monotonic()
            out["prefix"] = asyncio.run(prefix_run(model, agent_zero_prompt or None))
            spent += round(time.monotonic() - started, 1)
        if not prefix_only:
            levels = [int(x) for x in concurrency.split(",") if x.strip()]
            left = max(1.0, budget_s - spent) if budget_s else None
            out = {**asyncio.run(run_bench(model, prompts, levels, max_tokens, left)), **out}
        typer.echo(json.dumps(out))


def _register_metrics(bench: typer.Typer) -> None:
    @bench.command("metrics")
    def bench_metrics(
        batch: int = typer.Option(256, help="Messages per batch (the services' batch size)."),
    ) -> None:
        """CPU cost of the metrics hooks per trajectory / message / request, and of a scrape."""
        from agentrl.bench.metrics import run_metrics_benchmark
        from agentrl.bench.report import report

        res = run_metrics_benchmark(batch=batch)
        report(
            "metrics hooks (CPU time, best of 7)",
            [{"hook": k, "value": v} for k, v in res.items()],
            res,
        )


def _register_startup(bench: typer.Typer) -> None:
    @bench.command("startup")
    def bench_startup(
        keep: bool = typer.Option(False, help="Keep the data dirs and logs of both starts."),
    ) -> None:
        """`agentrl up` from an empty model cache and from a warm one to the first token
        streamed through the gateway, each service's ready time, and SIGINT to exit
        (targets on 2 cores: warm <= 30 s, cold <= 3 min, exit <= 5 s)."""
        from agentrl.bench.startup import run

        run(keep=keep)


def _register_argparse(bench: typer.Typer, name: str, module: str) -> None:
    """A benchmark whose module parses its own arguments (`main(argv)`): every argument,
    `--help` included, goes to it. The help line is the module docstring's first line."""
    import ast
    import importlib
    import importlib.util

    spec = importlib.util.find_spec(module)  # its docstring without importing it (torch)
    source = Path(spec.origin).read_text() if spec and spec.origin else ""
    first = (ast.get_docstring(ast.parse(source)) or name).split("\n\n")[0]

    @bench.command(
        name,
        help=" ".join(first.split()) + " (`--help` lists its options)",
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def run(ctx: typer.Context) -> None:
        importlib.import_module(module).main(list(ctx.args))


def _register_choice(bench: typer.Typer) -> None:
    @bench.command("choice")
    def bench_choice(
        model: str = typer.Option("smollm2", help="Local model: smollm2 or tiny (random)."),
        prompts: int = typer.Option(64, help="Distinct FrozenLake prompts per peer."),
        seed: int = typer.Option(0, help="Seed of the episodes and the model."),
    ) -> None:
        """guided_choice scoring on the local backend: prompts/s one at a time, batched at 8
        and 32 in flight, and the path before batching, on the loop's own prompts."""
        from agentrl.bench.choice import print_choice_bench

        print_choice_bench(model=model, prompts=prompts, seed=seed)


def _register_capture(bench: typer.Typer) -> None:
    @bench.command("capture")
    def bench_capture(
        sessions: int = typer.Option(1000, min=1, help="Concurrent sessions (episodes)."),
        turns: int = typer.Option(5, min=1, help="Requests per session (the last is text)."),
        connections: int = typer.Option(64, min=1, help="HTTP connections of the clients."),
        otlp_traces: int = typer.Option(2000, min=100, help="GenAI traces posted as OTLP."),
        extra: int = typer.Option(
            20,
            min=1,
            help="Runs of each hard case: gateway + OTLP, threads, timeout, one user's two "
            "conversations, an oversized episode.",
        ),
    ) -> None:
        """Episodes at the gateway under load (published = sent, tracking cost per request),
        the cases that used to duplicate, split, merge or lose episodes, and the OTLP
        receiver's spans per second."""
        from agentrl.bench.capture import main

        out = main(sessions, turns, connections, otlp_traces, extra)
        bad = ("lost", "failed_requests", "duplicate_episodes", "split_episodes")
        if any(out[k] for k in (*bad, "merged_episodes")):
            raise typer.Exit(1)


SOAK_OPTIONS = (
    "data_dir",
    "agents",
    "threshold",
    "restart_delay_s",
    "recover_timeout_s",
    "replicas",
    "cluster",
)


def _register_soak(app: typer.Typer) -> None:
    import inspect

    from agentrl.bench.soak_config import SoakConfig
    from agentrl.core.configcli import model_command

    own = [
        inspect.Parameter(
            "quick",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(
                False, "--quick", help="With --replicas: shorter waits, a smaller threshold."
            ),
            annotation=bool,
        ),
        _show_config_option(),
    ]
    app.command("soak")(model_command(SoakConfig, SOAK_OPTIONS, _soak, own))


def _soak(overrides: dict[str, object], *, quick: bool, show_config: bool) -> None:
    """Run the loop on a stack whose services are separate processes (tiny model, loopback
    only) and kill, once each, the reward service, the warehouse ingester, a running
    training job's process and nats-server (SIGKILL), restarting each. Then check that
    every trajectory has exactly one reward per version, the warehouse matches the
    streams, no job is stuck and every gateway error was counted. Prints the recovery
    times and checks; the last line is one JSON object; exit code 1 if a check failed."""
    import asyncio

    from pydantic import ValidationError

    from agentrl.bench.soak import LOG_FILE, main_json, run_soak, table
    from agentrl.bench.soak_config import SoakConfig
    from agentrl.core.logs import log_to_file

    try:
        cfg = SoakConfig(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if show_config:
        print(cfg.model_dump_json(indent=2))
        return

    def say(line: str) -> None:
        print(line, flush=True)

    folder = cfg.data_dir.resolve()  # refused before its log file is written into it
    if folder.exists() and any(p.name != LOG_FILE for p in folder.iterdir()):
        typer.echo(f"error: {folder} is not empty: give the soak a fresh folder", err=True)
        raise typer.Exit(2)
    say(f"log: {log_to_file(folder / LOG_FILE)}")
    if cfg.replicas > 1:
        from agentrl.bench.soak_replicas import main_json as replicas_json
        from agentrl.bench.soak_replicas import run_replicated_soak

        if quick:
            cfg.agents, cfg.threshold, cfg.settle_s = 1, min(cfg.threshold, 8), 3.0
            cfg.job_wait_s, cfg.drain_timeout_s = 180.0, 120.0
        replicas = cfg.replicas
        run, as_json = run_replicated_soak, lambda r: replicas_json(r, replicas)
    else:
        run, as_json = run_soak, main_json
    try:
        result = asyncio.run(run(cfg, say))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    except (asyncio.CancelledError, KeyboardInterrupt) as exc:
        typer.echo("soak stopped before the end (its services are stopped)", err=True)
        raise typer.Exit(130) from exc
    print(table(result), flush=True)
    sys.stdout.write(as_json(result) + "\n")
    sys.stdout.flush()
    if not result.ok:
        raise typer.Exit(1)
