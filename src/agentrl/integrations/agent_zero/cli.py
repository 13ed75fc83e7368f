"""`agentrl agent-zero ...`: install the plugin, flush its spool, send feedback, follow
deployments (heavy imports stay inside the commands)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer, bench: typer.Typer) -> None:
    a0 = typer.Typer(
        help=(
            "Agent Zero integration: a plugin that publishes every monologue as "
            "agent.rl.trajectory.v1, the rl_training tool, feedback and the deployment listener."
        ),
        no_args_is_help=True,
    )
    app.add_typer(a0, name="agent-zero")

    def plugin_config(path: Path):  # type: ignore[no-untyped-def]
        from agentrl.integrations.agent_zero.config import PLUGIN_NAME, load_config

        plugin_dir = path / "usr" / "plugins" / PLUGIN_NAME
        if not (plugin_dir / "plugin.yaml").is_file():
            raise typer.BadParameter(
                f"no agentrl plugin in {path} (run `agentrl agent-zero install`)"
            )
        return load_config(plugin_dir)

    @a0.command("install")
    def install_cmd(
        path: Path = typer.Argument(..., help="The Agent Zero checkout (its root folder)."),
        layout: str = typer.Option(
            "auto", help="plugin (usr/plugins/agentrl), legacy (python/extensions/) or auto."
        ),
        python: str = typer.Option(
            None,
            "--python",
            help="Agent Zero's Python (default: /opt/venv-a0/bin/python, PATH/.venv, PATH/venv).",
        ),
        client: bool = typer.Option(
            True, help="Install agentrl's client (agentrl-a0-client) into Agent Zero's Python."
        ),
        nats_url: str = typer.Option(
            None, "--nats-url", help="agentrl's NATS (`agentrl up` prints it; default: NATS_URL)."
        ),
        gateway_url: str = typer.Option(
            None,
            "--gateway-url",
            help="agentrl's gateway, .../v1 (default: AGENTRL_GATEWAY_PORT on loopback).",
        ),
        api_url: str = typer.Option(
            None, "--api-url", help="agentrl's control API (default: AGENTRL_API_PORT)."
        ),
        nats_token: str = typer.Option(None, "--nats-token", help="NATS token, if it asks."),
        api_token: str = typer.Option(None, "--api-token", help="A control API token."),
    ) -> None:
        """Copy the plugin into PATH, save where agentrl runs in the plugin's settings (its
        config.json, what the plugin and `agent-zero flush`/`feedback` read), install
        agentrl's client into Agent Zero's Python and print the chat model settings."""
        import tempfile

        from agentrl.integrations.agent_zero import client as a0client
        from agentrl.integrations.agent_zero.config import load_config, save_settings
        from agentrl.integrations.agent_zero.install import (
            install,
            model_settings,
            served_context,
            urls_from_environment,
        )

        if layout not in ("auto", "plugin", "legacy"):
            raise typer.BadParameter("layout is auto, plugin or legacy")
        try:
            done = install(path, None if layout == "auto" else layout)  # type: ignore[arg-type]
        except FileNotFoundError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        typer.echo(f"installed the agentrl plugin ({done.layout} layout) into {done.root}:")
        for f in done.files:
            typer.echo(f"  {f.relative_to(done.root)}")
        given = {
            "nats_url": nats_url,
            "gateway_url": gateway_url,
            "api_url": api_url,
            "nats_token": nats_token,
            "api_token": api_token,
        }
        chosen = {**urls_from_environment(), **{k: v for k, v in given.items() if v is not None}}
        if chosen:
            try:
                saved = save_settings(done.plugin_dir, chosen)
            except ValueError as exc:
                raise typer.BadParameter(str(exc)) from exc
            typer.echo(f"\nsaved {', '.join(sorted(chosen))} in {saved}")
        cfg = load_config(done.plugin_dir)
        typer.echo(
            f"\nthe plugin publishes to NATS {cfg.nats_url} (spool {cfg.spool_path()}); "
            f"gateway {cfg.gateway_url}; control API {cfg.api_url}"
        )
        if client:
            try:
                interpreter = a0client.find_interpreter(done.root, python)
                with tempfile.TemporaryDirectory() as tmp:
                    import agentrl

                    wheel = a0client.build_wheel(
                        Path(agentrl.__file__).parent, Path(tmp), a0client.installed_version()
                    )
                    a0client.install_client(interpreter, wheel)
            except (FileNotFoundError, RuntimeError) as exc:
                typer.echo(f"error: {exc}", err=True)
                typer.echo(
                    "the plugin is in place but inactive (a chat still works) until the client "
                    "is installed: run this again with --python",
                    err=True,
                )
                raise typer.Exit(2) from exc
            typer.echo(f"installed {a0client.DIST_NAME} ({wheel.name}) into {interpreter}")
        ctx = served_context(cfg.gateway_url, cfg.model_name, cfg.api_token)
        typer.echo("\n" + model_settings(cfg.gateway_url, cfg.model_name, ctx))

    @a0.command("flush")
    def flush_cmd(
        path: Path = typer.Argument(..., help="The Agent Zero checkout with the plugin."),
        timeout: float = typer.Option(30.0, help="Seconds to keep trying."),
    ) -> None:
        """Publish what the spool holds (oldest first)."""
        import asyncio

        from agentrl.integrations.agent_zero.publisher import Outbox

        outbox = Outbox(plugin_config(path))
        before = len(outbox.spool)
        sent = asyncio.run(outbox.flush(timeout, force=True))
        typer.echo(f"published {sent} of {before} spooled event(s); {len(outbox.spool)} left")
        if outbox.spool.bad_count():
            typer.echo(
                f"{outbox.spool.bad_count()} event(s) NATS refused for good are set aside in "
                f"{outbox.spool.folder} (*.bad, the reason in *.why)",
                err=True,
            )
        if outbox.last_error:
            typer.echo(f"error: {outbox.last_error}", err=True)
            raise typer.Exit(1)

    @a0.command("feedback")
    def feedback_cmd(
        path: Path = typer.Argument(..., help="The Agent Zero checkout with the plugin."),
        trajectory_id: str = typer.Argument(...),
        kind: str = typer.Argument(
            ..., help="thumbs_up, thumbs_down, rating, correction, abandoned"
        ),
        rating: int = typer.Option(None, min=1, max=5),
        comment: str = typer.Option(None),
        correction: str = typer.Option(None, help="The answer the agent should have given."),
    ) -> None:
        """Send user feedback on a trajectory (agent.rl.feedback.v1; spooled if NATS is away)."""
        import asyncio
        from typing import cast

        from pydantic import ValidationError

        from agentrl.contracts.feedback import FeedbackType
        from agentrl.integrations.agent_zero.feedback import feedback_event, send_feedback

        try:
            event = feedback_event(
                trajectory_id,
                cast(FeedbackType, kind),
                rating=rating,
                comment=comment,
                correction=correction,
            )
        except ValidationError as exc:
            raise typer.BadParameter(str(exc)) from exc
        sent = asyncio.run(send_feedback(plugin_config(path), event))
        typer.echo(f"feedback {event.feedback_id} {'published' if sent else 'spooled'}")

    @a0.command("listen")
    def listen_cmd(
        path: Path = typer.Argument(..., help="The Agent Zero checkout whose model to switch."),
        durable: str = typer.Option("agent-zero-deployments", help="Durable consumer name."),
    ) -> None:
        """Follow agent.rl.model.deployed.v1: keep Agent Zero on the gateway's public name (or,
        for another endpoint, switch to a version that takes all the traffic)."""
        import asyncio
        import signal

        from agentrl.bus import Bus
        from agentrl.integrations.agent_zero.deployment import ModelSwitcher, listen

        cfg = plugin_config(path)

        async def run() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            async with await Bus.connect(cfg.nats_url) as bus:
                await bus.ensure_streams()
                typer.echo(f"following deployments on {cfg.nats_url}; Ctrl-C stops", err=True)
                await listen(
                    bus, ModelSwitcher(path), stop, durable, cfg.model_name, cfg.gateway_url
                )

        asyncio.run(run())
