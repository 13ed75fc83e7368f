"""`agentrl lineage list|create|pause|resume|retire|map|promote|rollback`: the lifecycle of lineages
(`agentrl.release.lineage`) straight on the registry, with the same checks as the control
API (a refused action exits 2 and says why; nothing is written). Each command is a plain
function of its options model (`agentrl.release.options`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import typer

from agentrl.core.configcli import config_command
from agentrl.release.options import (
    Connection,
    LineageCreate,
    LineageMap,
    LineagePause,
    LineagePromote,
    LineageRef,
    LineageResume,
    LineageRetire,
    LineageRollback,
)

Action = Callable[[Any, Any, Any], Awaitable[Any]]  # (lineages, deploy settings, bus) -> answer


def register(app: typer.Typer) -> None:
    lineage = typer.Typer(
        help="Lineages: one public model name per agent, each with its own versions, split, "
        "canary, validation and training.",
        no_args_is_help=True,
    )
    app.add_typer(lineage, name="lineage")
    for name, model, run in COMMANDS:
        arguments = [f for f in ("name", "model_id") if f in model.model_fields]
        flags = {"parent": ["--from"]}
        command = config_command(model, None, run, flags=flags, arguments=arguments)
        lineage.command(name)(command)


def _run(fn: Action, nats_url: str | None) -> Any:
    import asyncio

    from agentrl.bus import Bus
    from agentrl.release.lineage import Lineages
    from agentrl.serving.config import DeploySettings
    from agentrl.serving.registry import Registry

    async def main() -> Any:
        deploy = DeploySettings()
        bus = await Bus.connect(nats_url, name="agentrl-lineage-cli")
        try:
            await bus.ensure_streams()
            registry = await Registry.open(bus.js, deploy.bucket)
            return await fn(Lineages(registry, deploy.public_model), deploy, bus)
        finally:
            await bus.close()

    return asyncio.run(main())


def _act(cfg: Connection, fn: Action) -> None:
    """Run `fn`, print its answer as JSON; a refused action exits 2 with the reason."""
    from agentrl.serving.errors import DeployError

    try:
        out = _run(fn, cfg.nats_url)
    except (DeployError, ValueError) as exc:
        typer.echo(f"refused: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(out, indent=2, default=str))


def _brief(lin: Any) -> dict[str, Any]:
    return {
        "name": lin.name,
        "state": lin.state,
        "agents": lin.agents,
        "profiles": lin.profiles,
        "start": lin.start,
        "parent": lin.parent,
        "parent_model": lin.parent_model,
    }


def _list(cfg: Connection) -> None:
    """Every lineage (the default first) with its state, agents and live version."""

    async def fn(lins: Any, _deploy: Any, _bus: Any) -> Any:
        out = []
        for lin in await lins.all():
            split, _ = await lins.registry.get_split(lin.name)
            rollout = await lins.registry.get_rollout(lin.name)
            out.append(
                {
                    **_brief(lin),
                    "live": split.live if split else None,
                    "weights": split.weights if split else {},
                    "rollout": None
                    if rollout is None
                    else {
                        "model_id": rollout.model_id,
                        "status": rollout.status,
                        "step": rollout.step,
                        "paused": rollout.paused,
                    },
                }
            )
        return out

    _act(cfg, fn)


def _create(cfg: LineageCreate) -> None:
    """Create a lineage starting from the base model or another lineage's live one."""
    from agentrl.release.lineage import check_name

    async def fn(lins: Any, deploy: Any, bus: Any) -> Any:
        check_name(cfg.name)
        return _brief(
            await lins.create(
                cfg.name,
                base_model=deploy.base_model,
                agents=cfg.agent,
                profiles=cfg.profile,
                parent=cfg.parent,
                validation=cfg.validation_settings(),
                by="cli",
                reason=cfg.reason,
                bus=bus,
            )
        )

    _act(cfg, fn)


def _set_state(cfg: LineageRef, state: str) -> None:
    async def fn(lins: Any, _deploy: Any, bus: Any) -> Any:
        return _brief(await lins.set_state(cfg.name, state, by="cli", reason=cfg.reason, bus=bus))

    _act(cfg, fn)


def _pause(cfg: LineagePause) -> None:
    """Pause a lineage: served as it is, nothing new deployed."""
    _set_state(cfg, "paused")


def _resume(cfg: LineageResume) -> None:
    """Resume a paused lineage."""
    _set_state(cfg, "active")


def _retire(cfg: LineageRetire) -> None:
    """Retire a lineage: no longer routed (404)."""
    _set_state(cfg, "retired")


def _map(cfg: LineageMap) -> None:
    """Route agents / Agent Zero profiles to lineage NAME."""

    async def fn(lins: Any, _deploy: Any, _bus: Any) -> Any:
        lin = await lins.assign(
            cfg.name, agents=cfg.agent, profiles=cfg.profile, by="cli", reason=cfg.reason
        )
        return _brief(lin)

    _act(cfg, fn)


def _deployer(lins: Any, bus: Any, name: str) -> Any:
    from agentrl.release.actions import Deployer

    return Deployer(lins.registry, bus, name)


def _rollback(cfg: LineageRollback) -> None:
    """Traffic of lineage NAME back to its previous version (its split only)."""

    async def fn(lins: Any, _deploy: Any, bus: Any) -> Any:
        await lins.get(cfg.name)
        return (await _deployer(lins, bus, cfg.name).rollback(by="cli", reason=cfg.reason)).model_id

    _act(cfg, fn)


def _promote(cfg: LineagePromote) -> None:
    """Give lineage NAME's running canary (or its MODEL_ID) all of its traffic now."""

    async def fn(lins: Any, _deploy: Any, bus: Any) -> Any:
        await lins.get(cfg.name)
        d = _deployer(lins, bus, cfg.name)
        return (await d.promote(cfg.model_id, by="cli", reason=cfg.reason)).model_id

    _act(cfg, fn)


COMMANDS: list[tuple[str, type[Connection], Callable[..., None]]] = [
    ("list", Connection, _list),
    ("create", LineageCreate, _create),
    ("pause", LineagePause, _pause),
    ("resume", LineageResume, _resume),
    ("retire", LineageRetire, _retire),
    ("map", LineageMap, _map),
    ("rollback", LineageRollback, _rollback),
    ("promote", LineagePromote, _promote),
]
