"""`agentrl deploy ...` (registry, split, promote / rollback / pause / resume / weight,
TensorZero export, `serve`: the controller and gateway without the rest of `agentrl up`).
Each command is a plain function of its options model (`agentrl.release.options`); heavy
imports stay inside the commands."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import typer

from agentrl.core.configcli import config_command
from agentrl.release.options import (
    Connection,
    Decision,
    ModelRef,
    Pause,
    Promote,
    Resume,
    Rollback,
    TensorZero,
    Weight,
)


def register(app: typer.Typer) -> None:
    deploy = typer.Typer(
        help="Model deployment: the registry, the traffic split and the human-in-the-loop "
        "actions (promote, rollback, pause, resume, weight), and the OpenAI-compatible gateway.",
        no_args_is_help=True,
    )
    app.add_typer(deploy, name="deploy")
    from agentrl.release import lineage_cli

    lineage_cli.register(app)
    for name, model, run, arguments in COMMANDS:
        deploy.command(name)(config_command(model, None, run, arguments=arguments))


def _run(coro_fn: Callable[[Any], Awaitable[Any]], nats_url: str | None) -> Any:
    """`coro_fn(deployer)` on the registry of the running stack, its bus closed after."""
    import asyncio

    from agentrl.bus import Bus
    from agentrl.core.settings import get_settings
    from agentrl.release.actions import Deployer
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry

    async def main() -> Any:
        s = get_settings()
        deploy = DeploySettings()
        bus = await Bus.connect(nats_url, name="agentrl-deploy-cli")
        try:
            await bus.ensure_streams()
            registry = await Registry.open(bus.js, deploy.bucket)
            d = Deployer(
                registry,
                bus,
                deploy.public_model,
                f"http://{s.gateway_host}:{s.gateway_port}/v1/chat/completions",
            )
            return await coro_fn(d)
        finally:
            await bus.close()

    return asyncio.run(main())


def _act(cfg: Connection, fn: Callable[[Any], Awaitable[Any]]) -> None:
    """Run `fn`, print its answer as JSON; a refused action exits 2 with the reason."""
    from agentrl.serving.errors import DeployError

    try:
        out = _run(fn, cfg.nats_url)
    except DeployError as exc:
        typer.echo(f"refused: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(out, indent=2, default=str))


def _models(cfg: Connection) -> None:
    """List the registered models with their state, weight and last decision."""

    async def fn(d: Any) -> Any:
        return [
            {
                "model_id": m.model_id,
                "state": m.state,
                "weight": m.traffic_weight,
                "best": m.best,
                "last": m.decisions[-1].reason if m.decisions else None,
            }
            for m in await d.registry.list_models()
        ]

    _act(cfg, fn)


def _show(cfg: ModelRef) -> None:
    """One model's record with its whole audit trail."""

    async def fn(d: Any) -> Any:
        return (await d.registry.require_model(cfg.model_id)).model_dump(mode="json")

    _act(cfg, fn)


def _split(cfg: Connection) -> None:
    """The current traffic split and the running rollout."""

    async def fn(d: Any) -> Any:
        s, _rev = await d.registry.get_split(d.public)
        r = await d.registry.get_rollout(d.public)
        return {
            "split": s.model_dump(mode="json") if s else None,
            "rollout": r.model_dump(mode="json") if r else None,
        }

    _act(cfg, fn)


def _promote(cfg: Promote) -> None:
    """Give the running canary (or MODEL_ID) all traffic now."""

    async def fn(d: Any) -> Any:
        return (await d.promote(cfg.model_id, by=cfg.by, reason=cfg.reason)).model_id

    _act(cfg, fn)


def _rollback(cfg: Decision) -> None:
    """Traffic back to the previous version at once."""

    async def fn(d: Any) -> Any:
        return (await d.rollback(by=cfg.by, reason=cfg.reason)).model_id

    _act(cfg, fn)


def _pause(cfg: Decision) -> None:
    """Hold the running rollout at its step: no automatic move (advance, promote or
    rollback) until `resume`; a human decides meanwhile."""

    async def fn(d: Any) -> Any:
        return (await d.pause(by=cfg.by, reason=cfg.reason)).model_dump(mode="json")

    _act(cfg, fn)


def _resume(cfg: Decision) -> None:
    """Let a paused rollout continue."""

    async def fn(d: Any) -> Any:
        return (await d.resume(by=cfg.by, reason=cfg.reason)).model_dump(mode="json")

    _act(cfg, fn)


def _weight(cfg: Weight) -> None:
    """Set the running canary's traffic to PERCENT (100 promotes)."""

    async def fn(d: Any) -> Any:
        rollout = await d.set_weight(cfg.percent, by=cfg.by, reason=cfg.reason)
        return rollout.model_dump(mode="json")

    _act(cfg, fn)


def _serve(cfg: Connection) -> None:
    """Run the deployment controller, its monitor and the gateway, as agentrl up does,
    against an existing NATS server; Ctrl-C stops.

    On its own host it needs NATS_URL, AGENTRL_GATEWAY_PORT (default 8700) open to the
    agents or a load balancer, and the checkpoints' storage readable (the paths or
    s3://… URLs the training runners write); the base model is loaded locally
    (AGENTRL_DEPLOY_BACKEND local, vllm or upstream).

    N copies may run behind a load balancer with the same AGENTRL_DEPLOY_BUCKET and
    AGENTRL_DEPLOY_PUBLIC_MODEL: every copy serves the registry's split (a session key
    hashes to the same version on each), logs each completion once (its id as
    Nats-Msg-Id), and one copy, elected through a KV lease (AGENTRL_DEPLOY_LEASE_TTL_S,
    default 6 s), runs the controller; a standby takes over from the registry alone.
    See docs/guide/replicas.md."""
    import asyncio
    import signal

    from agentrl.bus import Bus
    from agentrl.core.settings import get_settings
    from agentrl.release.service import serve

    async def main() -> None:
        settings = get_settings()
        bus = await Bus.connect(cfg.nats_url, name="agentrl-deploy")
        await bus.ensure_streams()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        typer.echo(
            f"gateway on http://{settings.gateway_host}:{settings.gateway_port}/v1; Ctrl-C stops",
            err=True,
        )
        try:
            await serve(bus, stop, settings)
        finally:
            await bus.close()

    asyncio.run(main())


def _tensorzero(cfg: TensorZero) -> None:
    """Print the split as TensorZero's functions.FUNCTION.experimentation (static weights)."""
    from agentrl.release.agent import tensorzero_experimentation

    async def fn(d: Any) -> Any:
        s, _rev = await d.registry.get_split(d.public)
        return tensorzero_experimentation(cfg.function, s.weights if s else {})

    typer.echo(_run(fn, cfg.nats_url))


# name, options model, body, the fields that are positional arguments
COMMANDS: list[tuple[str, type[Connection], Callable[..., None], tuple[str, ...]]] = [
    ("models", Connection, _models, ()),
    ("show", ModelRef, _show, ("model_id",)),
    ("split", Connection, _split, ()),
    ("promote", Promote, _promote, ("model_id",)),
    ("rollback", Rollback, _rollback, ()),
    ("pause", Pause, _pause, ()),
    ("resume", Resume, _resume, ()),
    ("weight", Weight, _weight, ("percent",)),
    ("serve", Connection, _serve, ()),
    ("tensorzero", TensorZero, _tensorzero, ()),
]
