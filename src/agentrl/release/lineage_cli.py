"""`agentrl lineage list|create|pause|resume|retire|map|promote|rollback`: the lifecycle of lineages
(`agentrl.release.lineage`) straight on the registry, with the same checks as the control
API (a refused action exits 2 and says why; nothing is written)."""

from __future__ import annotations

import json
from typing import Any

import typer


def _run(fn: Any, nats_url: str | None) -> Any:
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


def _act(fn: Any, nats_url: str | None) -> None:
    from agentrl.serving.errors import DeployError

    try:
        out = _run(fn, nats_url)
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


def register(app: typer.Typer) -> None:
    lineage = typer.Typer(
        help="Lineages: one public model name per agent, each with its own versions, split, "
        "canary, validation and training.",
        no_args_is_help=True,
    )
    app.add_typer(lineage, name="lineage")
    url_opt = typer.Option(None, "--nats-url", help="NATS server (default: NATS_URL).")

    @lineage.command("list")
    def list_(nats_url: str = url_opt) -> None:
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

        _act(fn, nats_url)

    @lineage.command("create")
    def create(
        name: str,
        agent: list[str] = typer.Option([], "--agent", help="An agent id routed to it."),
        profile: list[str] = typer.Option([], "--profile", help="An Agent Zero profile."),
        from_lineage: str = typer.Option(
            None, "--from", help="Start from this lineage's live version (default: the base)."
        ),
        validation: str = typer.Option(
            None, "--validation", help="JSON of validation settings (benchmark_tasks, ...)."
        ),
        reason: str = "created by cli",
        nats_url: str = url_opt,
    ) -> None:
        """Create a lineage starting from the base model or another lineage's live one."""
        from agentrl.release.lineage import check_name

        overrides = json.loads(validation) if validation else {}

        async def fn(lins: Any, deploy: Any, bus: Any) -> Any:
            check_name(name)
            return _brief(
                await lins.create(
                    name,
                    base_model=deploy.base_model,
                    agents=list(agent),
                    profiles=list(profile),
                    parent=from_lineage,
                    validation=overrides,
                    by="cli",
                    reason=reason,
                    bus=bus,
                )
            )

        _act(fn, nats_url)

    def state_command(cmd: str, state: str, doc: str) -> None:
        def command(name: str, reason: str = f"{cmd} by cli", nats_url: str = url_opt) -> None:
            async def fn(lins: Any, _deploy: Any, bus: Any) -> Any:
                return _brief(await lins.set_state(name, state, by="cli", reason=reason, bus=bus))

            _act(fn, nats_url)

        command.__doc__ = doc
        lineage.command(cmd)(command)

    state_command("pause", "paused", "Pause a lineage: served as it is, nothing new deployed.")
    state_command("resume", "active", "Resume a paused lineage.")
    state_command("retire", "retired", "Retire a lineage: no longer routed (404).")

    @lineage.command("map")
    def map_(
        name: str,
        agent: list[str] = typer.Option([], "--agent"),
        profile: list[str] = typer.Option([], "--profile"),
        reason: str = "mapped by cli",
        nats_url: str = url_opt,
    ) -> None:
        """Route agents / Agent Zero profiles to lineage NAME."""

        async def fn(lins: Any, _deploy: Any, _bus: Any) -> Any:
            return _brief(
                await lins.assign(
                    name, agents=list(agent), profiles=list(profile), by="cli", reason=reason
                )
            )

        _act(fn, nats_url)

    def deployer(lins: Any, bus: Any, name: str) -> Any:
        from agentrl.release.actions import Deployer

        return Deployer(lins.registry, bus, name)

    @lineage.command("rollback")
    def rollback(name: str, reason: str = "manual rollback", nats_url: str = url_opt) -> None:
        """Traffic of lineage NAME back to its previous version (its split only)."""

        async def fn(lins: Any, _deploy: Any, bus: Any) -> Any:
            await lins.get(name)
            return (await deployer(lins, bus, name).rollback(by="cli", reason=reason)).model_id

        _act(fn, nats_url)

    @lineage.command("promote")
    def promote(
        name: str,
        model_id: str = typer.Argument(None),
        reason: str = "manual promote",
        nats_url: str = url_opt,
    ) -> None:
        """Give lineage NAME's running canary (or its MODEL_ID) all of its traffic now."""

        async def fn(lins: Any, _deploy: Any, bus: Any) -> Any:
            await lins.get(name)
            d = deployer(lins, bus, name)
            return (await d.promote(model_id, by="cli", reason=reason)).model_id

        _act(fn, nats_url)
