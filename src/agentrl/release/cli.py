"""`agentrl deploy ...` (registry, split, promote / rollback / pause / resume / weight,
TensorZero export, `serve`: the controller and gateway without the rest of `agentrl up`).
Heavy imports stay inside the commands."""

from __future__ import annotations

import json
from typing import Any

import typer


def _run(coro_fn: Any, nats_url: str | None) -> Any:
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
            return await coro_fn(d, deploy)
        finally:
            await bus.close()

    return asyncio.run(main())


def register(app: typer.Typer) -> None:
    deploy = typer.Typer(
        help="Model deployment: the registry, the traffic split and the human-in-the-loop "
        "actions (promote, rollback, pause, resume, weight), and the OpenAI-compatible gateway.",
        no_args_is_help=True,
    )
    app.add_typer(deploy, name="deploy")
    from agentrl.release import lineage_cli

    lineage_cli.register(app)
    url_opt = typer.Option(None, "--nats-url", help="NATS server (default: NATS_URL).")

    def act(name: str, fn: Any, nats_url: str | None) -> None:
        from agentrl.serving.errors import DeployError

        try:
            out = _run(fn, nats_url)
        except DeployError as exc:
            typer.echo(f"refused: {exc}", err=True)
            raise typer.Exit(2) from exc
        typer.echo(json.dumps(out, indent=2, default=str))

    @deploy.command("models")
    def models(nats_url: str = url_opt) -> None:
        """List the registered models with their state, weight and last decision."""

        async def fn(d: Any, _: Any) -> Any:
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

        act("models", fn, nats_url)

    @deploy.command("show")
    def show(model_id: str, nats_url: str = url_opt) -> None:
        """One model's record with its whole audit trail."""

        async def fn(d: Any, _: Any) -> Any:
            return (await d.registry.require_model(model_id)).model_dump(mode="json")

        act("show", fn, nats_url)

    @deploy.command("split")
    def split(nats_url: str = url_opt) -> None:
        """The current traffic split and the running rollout."""

        async def fn(d: Any, _: Any) -> Any:
            s, _rev = await d.registry.get_split(d.public)
            r = await d.registry.get_rollout(d.public)
            return {
                "split": s.model_dump(mode="json") if s else None,
                "rollout": r.model_dump(mode="json") if r else None,
            }

        act("split", fn, nats_url)

    @deploy.command("promote")
    def promote(
        model_id: str = typer.Argument(None),
        reason: str = "manual promote",
        by: str = "cli",
        nats_url: str = url_opt,
    ) -> None:
        """Give the running canary (or MODEL_ID) all traffic now."""

        async def fn(d: Any, _: Any) -> Any:
            return (await d.promote(model_id, by=by, reason=reason)).model_id

        act("promote", fn, nats_url)

    @deploy.command("rollback")
    def rollback(reason: str = "manual rollback", by: str = "cli", nats_url: str = url_opt) -> None:
        """Traffic back to the previous version at once."""

        async def fn(d: Any, _: Any) -> Any:
            return (await d.rollback(by=by, reason=reason)).model_id

        act("rollback", fn, nats_url)

    @deploy.command("pause")
    def pause(reason: str = "paused by a human", by: str = "cli", nats_url: str = url_opt) -> None:
        """Hold the running rollout at its step: no automatic move (advance, promote or
        rollback) until `resume`; a human decides meanwhile."""

        async def fn(d: Any, _: Any) -> Any:
            return (await d.pause(by=by, reason=reason)).model_dump(mode="json")

        act("pause", fn, nats_url)

    @deploy.command("resume")
    def resume(
        reason: str = "resumed by a human", by: str = "cli", nats_url: str = url_opt
    ) -> None:
        """Let a paused rollout continue."""

        async def fn(d: Any, _: Any) -> Any:
            return (await d.resume(by=by, reason=reason)).model_dump(mode="json")

        act("resume", fn, nats_url)

    @deploy.command("weight")
    def weight(
        percent: float, reason: str = "manual ramp", by: str = "cli", nats_url: str = url_opt
    ) -> None:
        """Set the running canary's traffic to PERCENT (100 promotes)."""

        async def fn(d: Any, _: Any) -> Any:
            return (await d.set_weight(percent, by=by, reason=reason)).model_dump(mode="json")

        act("weight", fn, nats_url)

    @deploy.command("serve")
    def serve_cmd(nats_url: str = url_opt) -> None:
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
            bus = await Bus.connect(nats_url, name="agentrl-deploy")
            await bus.ensure_streams()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            typer.echo(
                f"gateway on http://{settings.gateway_host}:{settings.gateway_port}/v1; "
                "Ctrl-C stops",
                err=True,
            )
            try:
                await serve(bus, stop, settings)
            finally:
                await bus.close()

        asyncio.run(main())

    @deploy.command("tensorzero")
    def tensorzero(function: str = "agent", nats_url: str = url_opt) -> None:
        """Print the split as TensorZero's functions.FUNCTION.experimentation (static weights)."""
        from agentrl.release.agent import tensorzero_experimentation

        async def fn(d: Any, _: Any) -> Any:
            s, _rev = await d.registry.get_split(d.public)
            return tensorzero_experimentation(function, s.weights if s else {})

        typer.echo(_run(fn, nats_url))
