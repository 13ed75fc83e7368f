"""`agentrl loop`: the whole feedback loop on the whole stack (heavy imports inside)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
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
        threshold: int = typer.Option(
            0, help="Rewarded trajectories per training job (0: default)."
        ),
        heldout_seeds: int = typer.Option(0, help="Held-out maps per version (0: default)."),
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
        backend: str = typer.Option(
            "local",
            help="The gateway's serving backend: local (embedded) or vllm (a supervised "
            "`vllm serve`, every version a LoRA loaded at run time; `agentrl vllm setup`).",
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
    ) -> None:
        """Run the stack of `agentrl up`, let agents act through the gateway, and watch
        rewards -> trigger -> training job -> validation -> canary -> promotion or rollback,
        for several generations; then held-out success per version, the report, one JSON line."""
        from agentrl.loop import LoopConfig, run_loop, table

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
        if data_dir is not None:
            overrides["data_dir"] = data_dir
        if generations:
            overrides["generations"] = generations
        if threshold:
            overrides["threshold"] = threshold
        if heldout_seeds:
            overrides["heldout_seeds"] = heldout_seeds
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
            # vLLM samples a guided_choice token by token and refuses temperature > 2; the
            # local backend scores the choices, where 6 is near-uniform exploration
            if temperature:
                typer.echo("error: vLLM takes temperature <= 2 (--temperature)", err=True)
                raise typer.Exit(2)
            cfg.temperature = 2.0
            print("vllm: agents explore at temperature 2 (vLLM's maximum; local: 6)", flush=True)

        def say(line: str) -> None:
            print(line, flush=True)

        import asyncio

        try:
            result = asyncio.run(run_loop(cfg, say))
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
