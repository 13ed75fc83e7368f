"""The application's commands: `agentrl up` (the stack), `agentrl loop` (the main job: the
whole feedback loop on it), `agentrl soak` (the loop under faults), `agentrl report` and
`agentrl bench capture` (the gateway and the capture service together). Heavy imports live
inside the commands, so `agentrl --help` stays fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    _register_loop(app)
    _register_up(app)
    _register_soak(app)
    _register_report(app)
    _register_bench_capture(bench)
    _register_bench_startup(bench)
    _register_bench_choice(bench)
    _register_retired(app)


def _register_bench_startup(bench: typer.Typer) -> None:
    @bench.command("startup")
    def bench_startup(
        keep: bool = typer.Option(False, help="Keep the data dirs and logs of both starts."),
    ) -> None:
        """`agentrl up` from an empty model cache and from a warm one to the first token
        streamed through the gateway, each service's ready time, and SIGINT to exit
        (targets on 2 cores: warm <= 30 s, cold <= 3 min, exit <= 5 s)."""
        from agentrl.app.bench_startup import run

        run(keep=keep)


def _register_report(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        out: Path = typer.Option(..., "--out", help="Directory for index.html and the PNG plots."),
        source: str = typer.Option(
            "auto",
            help="Where the data comes from: auto (warehouse, else streams), warehouse, streams.",
        ),
        nats_url: str = typer.Option(
            None, help="NATS server for --source streams (default: NATS_URL)."
        ),
        hours: float = typer.Option(24 * 7, help="How far back to read."),
    ) -> None:
        """Write an HTML report: held-out success per version (DIR/heldout.json), lineage, plots."""
        from agentrl.app.report import run_report

        page = run_report(out, source=source, nats_url=nats_url, hours=hours)
        typer.echo(f"report: {page}")


def _register_bench_choice(bench: typer.Typer) -> None:
    @bench.command("choice")
    def bench_choice(
        model: str = typer.Option("smollm2", help="Local model: smollm2 or tiny (random)."),
        prompts: int = typer.Option(64, help="Distinct FrozenLake prompts per peer."),
        seed: int = typer.Option(0, help="Seed of the episodes and the model."),
    ) -> None:
        """guided_choice scoring on the local backend: prompts/s one at a time, batched at 8
        and 32 in flight, and the path before batching, on the loop's own prompts."""
        from agentrl.app.bench_choice import print_choice_bench

        print_choice_bench(model=model, prompts=prompts, seed=seed)


def _register_bench_capture(bench: typer.Typer) -> None:
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
        from agentrl.app.bench_capture import main

        out = main(sessions, turns, connections, otlp_traces, extra)
        bad = ("lost", "failed_requests", "duplicate_episodes", "split_episodes")
        if any(out[k] for k in (*bad, "merged_episodes")):
            raise typer.Exit(1)


def _register_retired(app: typer.Typer) -> None:
    @app.command("demo", hidden=True, deprecated=True)
    def demo(
        data_dir: Path = typer.Option(None, help="A folder of the loop's own for this run."),
    ) -> None:
        """Retired: the first closed loop, superseded by `agentrl loop --quick` (which it runs)."""
        typer.echo(
            "agentrl demo is retired: it runs `agentrl loop --quick` now (the same chain on "
            "the whole stack); use that command.",
            err=True,
        )
        loop = typer.main.get_command(app).get_command(None, "loop")  # type: ignore[attr-defined]
        args = ["--quick"] + (["--data-dir", str(data_dir)] if data_dir else [])
        loop.main(args, standalone_mode=False)


def _register_loop(app: typer.Typer) -> None:
    @app.command("loop")
    def loop_cmd(
        quick: bool = typer.Option(
            False,
            "--quick",
            help="The short version (about 2 minutes on 2 shared cores): tiny random model, "
            "one generation; shows the chain, not learning.",
        ),
        bad_candidate: bool = typer.Option(
            False,
            "--bad-candidate",
            help="After the generations, deploy a deliberately broken version by hand to show "
            "the automatic rollback.",
        ),
        data_dir: Path = typer.Option(
            None,
            help="A folder of the loop's own for this run's stack (default ./.agentrl/loop); "
            "wiped at the start of each run, refused if it holds other data.",
        ),
        generations: int = typer.Option(0, help="Training generations (0: the mode's default)."),
        until_benchmark: float = typer.Option(
            None,
            min=0.0,
            max=1.0,
            help="FrozenLake: after the generations, go on (up to 9) while the live version's "
            "own validation benchmark (greedy success on its 60 validation maps, never the "
            "held-out ones) is below this (default 0.6; 0: stop after the generations).",
        ),
        threshold: int = typer.Option(
            0, help="Rewarded trajectories per training job (0: default)."
        ),
        heldout_seeds: int = typer.Option(0, help="Held-out maps per version (0: default)."),
        unseen_seeds: int = typer.Option(
            -1, help="Tool use: unseen-phrasing pool tasks per version (-1: default, 0: off)."
        ),
        model: str = typer.Option(None, help="Base model (default smollm2; tiny with --quick)."),
        time_budget_s: float = typer.Option(0, help="Stop acting after this many seconds."),
        pace: bool = typer.Option(
            True,
            "--pace/--no-pace",
            help="While a training job runs one agent acts, a group every 3 s (on 2 cores acting would "
            "starve the job); --no-pace: all agents act all the time.",
        ),
        temperature: float = typer.Option(
            0,
            help="The agents' sampling temperature over the moves (0: default, 6 — exploring; "
            "held-out evaluation is always greedy).",
        ),
        learning_rate: float = typer.Option(
            0,
            help="Each job's learning rate (0: default, 2e-3 — measured: 5e-4 needed 4-6 "
            "generations to leave 0 % held-out success, 2e-3 two).",
        ),
        gamma: float = typer.Option(
            None,
            min=0.0,
            max=1.0,
            help="FrozenLake: the jobs' discount of step returns (default 0.5 — the agents explore "
            "near-randomly, so a return's far future is noise; at 0.99 learning came 2-3 "
            "jobs later).",
        ),
        backend: str = typer.Option(
            "local",
            help="The gateway's serving backend: local (embedded) or vllm (a supervised "
            "`vllm serve`, every version a LoRA loaded at run time; `agentrl vllm setup`). "
            "With vllm the FrozenLake loop is sized to a CPU core (LoopConfig.on_vllm: 2 agents "
            "x groups of 4, rank-8 adapters, one generation; about 35 minutes on 2 cores).",
        ),
        env: str = typer.Option(
            "frozenlake",
            help="frozenlake: the valid-action loop (guided_choice over the moves); tooluse: "
            "Agent Zero agents answering tool-use tasks in free-form JSON under structured "
            "outputs (calculator, code_exe, response), trained on the logged tokens.",
        ),
        init_checkpoint: str = typer.Option(
            None,
            help="Start acting with this checkpoint (a warm start, e.g. from `agentrl learn "
            "--config configs/tooluse-warmstart.yaml`): registered and promoted first.",
        ),
        structured: bool = typer.Option(
            True,
            "--structured/--no-structured",
            help="--env tooluse: decode every reply under Agent Zero's reply schema (default); "
            "--no-structured is the ablation (free text, parsed as it comes).",
        ),
        job_kind: str = typer.Option(
            "dataset",
            help="Training job kind the trigger starts; only dataset (the logged trajectories) "
            "is wired in.",
        ),
        lineages: int = typer.Option(
            0,
            help="FrozenLake: this many lineages (1-2; 4x4 and 5x5 maps), each trained on its "
            "own agents' trajectories, validated and canaried on its own; with "
            "--bad-candidate the drill breaks the first lineage's canary (app.loop_lineages).",
        ),
    ) -> None:
        """Run the stack of `agentrl up`, let agents act through the gateway, and watch
        rewards -> trigger -> training job -> validation -> canary -> promotion or rollback,
        for several generations; then held-out success per version, the report, one JSON line."""
        from agentrl.app.loop import LoopConfig, run_loop, table

        overrides: dict[str, object] = {
            "bad_candidate": bad_candidate,
            "job_kind": job_kind,
            "pace": pace,
            "backend": backend,
        }
        if temperature:
            overrides["temperature"] = temperature
        if learning_rate:
            overrides["learning_rate"] = learning_rate
        if gamma is not None:
            overrides["gamma"] = gamma
        if data_dir is not None:
            overrides["data_dir"] = data_dir
        if generations:
            overrides["generations"] = generations
        if until_benchmark is not None:
            overrides["until_benchmark"] = until_benchmark
        if threshold:
            overrides["threshold"] = threshold
        if heldout_seeds:
            overrides["heldout_seeds"] = heldout_seeds
        if unseen_seeds >= 0:
            overrides["unseen_seeds"] = unseen_seeds
        if model:
            overrides["model"] = model
        if time_budget_s:
            overrides["time_budget_s"] = time_budget_s
        if init_checkpoint:
            overrides["init_checkpoint"] = init_checkpoint
        if not structured:
            overrides["structured"] = False
        if env == "tooluse":
            cfg = LoopConfig.tooluse(quick=quick, **overrides)
        elif env == "frozenlake" and backend == "vllm" and not quick:
            cfg = LoopConfig.on_vllm(**overrides)  # sized to what vLLM's CPU build answers
        elif env == "frozenlake":
            cfg = LoopConfig.quick(**overrides) if quick else LoopConfig(**overrides)  # type: ignore[arg-type]
        else:
            typer.echo(f"error: --env is frozenlake or tooluse, not {env!r}", err=True)
            raise typer.Exit(2)
        if cfg.backend not in ("local", "vllm"):
            typer.echo(f"error: --backend is local or vllm, not {cfg.backend!r}", err=True)
            raise typer.Exit(2)
        if cfg.backend == "vllm" and cfg.model in ("tiny", "tiny-random"):
            typer.echo(
                "error: the tiny model's head size (16) is not one vLLM's CPU kernels run; "
                "use --backend vllm with smollm2 (not --quick)",
                err=True,
            )
            raise typer.Exit(2)
        if cfg.backend == "vllm" and cfg.temperature > 2.0:
            # vLLM samples a guided_choice token by token and refuses temperature > 2 (the
            # local backend scores the choices, where 6 is near-uniform exploration); every
            # vLLM profile explores at 2 or less, so only --temperature gets here
            typer.echo("error: vLLM takes temperature <= 2 (--temperature)", err=True)
            raise typer.Exit(2)

        def say(line: str) -> None:
            print(line, flush=True)

        import asyncio

        if lineages:
            _loop_lineages(cfg, lineages, bad_candidate, say)
            return
        try:
            result = asyncio.run(run_loop(cfg, say, log_file="loop.log"))
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        except (asyncio.CancelledError, KeyboardInterrupt) as exc:
            typer.echo("stopped before the end: no table", err=True)
            raise typer.Exit(130) from exc
        print(table(result), flush=True)
        if result.report:
            print(f"report: {result.report}", flush=True)
        sys.stdout.write(json.dumps(result.summary()) + "\n")
        sys.stdout.flush()


def _loop_lineages(cfg: Any, n: int, drill: bool, say: Any) -> None:
    """`agentrl loop --lineages N`: the table per lineage, then one JSON line."""
    import asyncio

    from agentrl.app.loop_lineages import run_lineages, table

    if cfg.env != "frozenlake" or cfg.backend != "local":
        typer.echo("error: --lineages runs the FrozenLake loop on the local backend", err=True)
        raise typer.Exit(2)
    try:
        result = asyncio.run(run_lineages(cfg, n, say, drill=drill, log_file="loop.log"))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    print(table(result), flush=True)
    if result.report:
        print(f"report: {result.report}", flush=True)
    sys.stdout.write(json.dumps(result.summary()) + "\n")
    sys.stdout.flush()


def _register_up(app: typer.Typer) -> None:
    @app.command()
    def up(
        data_dir: str = typer.Option(
            None, help="Data dir (default AGENTRL_DATA_DIR or ./.agentrl)."
        ),
        port: int = typer.Option(0, help="NATS port; 0 picks a free one."),
        no_services: bool = typer.Option(
            False, "--no-services", help="Only the NATS server and its streams."
        ),
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
        "agentrl is up" is printed once the gateway serves; until then it says
        what it waits for (the first start converts the bundled model: minutes).
        The converted model is cached once for every data dir in
        ~/.cache/agentrl/models ($XDG_CACHE_HOME; AGENTRL_MODELS_DIR moves it).

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
        Capture: requests with a session key (header x-agentrl-session) form
        one episode until POST /v1/episodes/{key}/end or 300 s idle
        (AGENTRL_CAPTURE_IDLE_TIMEOUT_S). A request waits at most
        AGENTRL_DEPLOY_BACKEND_TIMEOUT_S (300) for its answer, then gets a
        504 (logged; the episode keeps it as a failed turn): raise it when a
        big model on a CPU answers slower.

        \b
        Agent Zero: `agentrl agent-zero install PATH_TO_AGENT_ZERO` copies the
        plugin and prints the chat model settings: provider OpenAI-compatible
        ("other"), model "agentrl-policy", API base http://127.0.0.1:8700/v1.
        Its trajectories then flow to NATS_URL (printed below) and train the
        next version.
        """
        from agentrl.app.stack import run_stack
        from agentrl.observability.multiproc import enable_for_stack

        enable_for_stack(data_dir)  # job child processes report to the one /metrics

        if cluster:
            _up_cluster(cluster, data_dir, not no_services, replicas)
            return
        run_stack(data_dir=data_dir, port=port or None, services=not no_services, replicas=replicas)


def _up_cluster(size: int, data_dir: str | None, services: bool, replicas: int = 1) -> None:
    """`agentrl up --cluster N`: N local nats-servers, NATS_URL pointing at all of them and
    AGENTRL_STREAM_REPLICAS=min(3, N), then the usual stack against them."""
    import os
    from pathlib import Path

    from agentrl.app.stack import run_stack
    from agentrl.bus.server import NatsCluster
    from agentrl.settings import get_settings

    base = Path(data_dir) if data_dir else get_settings().data_dir
    with NatsCluster(base / "cluster", size=size) as nodes:
        os.environ["NATS_URL"] = nodes.url
        os.environ["AGENTRL_STREAM_REPLICAS"] = str(min(3, size))
        get_settings.cache_clear()
        print(f"nats cluster of {size} servers, JetStream store under {base / 'cluster'}")
        for node in nodes.nodes:
            print(f"  {node.server_name} listening on {node.url}  log: {node.log_file}")
        run_stack(data_dir=data_dir, services=services, replicas=replicas)


def _register_soak(app: typer.Typer) -> None:
    @app.command("soak")
    def soak_cmd(
        data_dir: Path = typer.Option(
            Path(".agentrl/soak"), help="A fresh (empty or missing) folder for this soak's stack."
        ),
        agents: int = typer.Option(2, help="Agent workers acting through the gateway."),
        threshold: int = typer.Option(16, help="Rewarded trajectories per training job."),
        restart_delay_s: float = typer.Option(
            1.0, help="Seconds between a kill and the restart (a supervisor's backoff)."
        ),
        recover_timeout_s: float = typer.Option(
            120.0, help="A component not back after this long counts as not recovered."
        ),
        replicas: int = typer.Option(
            1,
            min=1,
            help="Run this many of every service (each replica its own processes) and kill "
            "one of each kind during the run (the replicated soak).",
        ),
        cluster: int = typer.Option(
            0,
            help="With --replicas: a NATS cluster of this many nodes (3); its stream "
            "leader is killed during the run.",
        ),
        quick: bool = typer.Option(
            False, "--quick", help="With --replicas: shorter waits and a smaller threshold."
        ),
    ) -> None:
        """Run the loop on a stack whose services are separate processes (tiny model, loopback
        only) and kill, once each, the reward service, the warehouse ingester, a running
        training job's process and nats-server (SIGKILL), restarting each. Then check that
        every trajectory has exactly one reward per version, the warehouse matches the
        streams, no job is stuck and every gateway error was counted. Prints the recovery
        times and checks; the last line is one JSON object; exit code 1 if a check failed."""
        import asyncio

        from agentrl.app.soak import SoakConfig, main_json, run_soak, table

        cfg = SoakConfig(
            data_dir=data_dir,
            agents=agents,
            threshold=threshold,
            restart_delay_s=restart_delay_s,
            recover_timeout_s=recover_timeout_s,
            replicas=replicas,
            cluster=cluster,
        )

        def say(line: str) -> None:
            print(line, flush=True)

        from agentrl.app.soak import LOG_FILE
        from agentrl.logs import log_to_file

        folder = data_dir.resolve()  # refused before its log file is written into it
        if folder.exists() and any(p.name != LOG_FILE for p in folder.iterdir()):
            typer.echo(f"error: {folder} is not empty: give the soak a fresh folder", err=True)
            raise typer.Exit(2)
        say(f"log: {log_to_file(folder / LOG_FILE)}")
        if replicas > 1:
            from agentrl.app.soak_replicas import main_json as replicas_json
            from agentrl.app.soak_replicas import run_replicated_soak

            if quick:
                cfg.agents, cfg.threshold, cfg.settle_s = 1, min(threshold, 8), 3.0
                cfg.job_wait_s, cfg.drain_timeout_s = 180.0, 120.0
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
