"""`agentrl agent-zero ...`: install the plugin, flush its spool, send feedback, follow
deployments (heavy imports stay inside the commands)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from agentrl.core.configcli import argument, config_command
from agentrl.integrations.agent_zero.options import (
    FeedbackOptions,
    FlushOptions,
    InstallOptions,
    ListenOptions,
)

if TYPE_CHECKING:
    from agentrl.integrations.agent_zero.config import AgentZeroConfig


def register(app: typer.Typer) -> None:
    a0 = typer.Typer(
        help=(
            "Agent Zero integration: a plugin that publishes every monologue as "
            "agent.rl.trajectory.v1, the rl_training tool, feedback and the deployment listener."
        ),
        no_args_is_help=True,
    )
    app.add_typer(a0, name="agent-zero")
    checkout = argument("path", "The Agent Zero checkout (its root folder).", Path)
    a0.command("install")(config_command(InstallOptions, None, _install, [checkout]))
    with_plugin = argument("path", "The Agent Zero checkout with the plugin.", Path)
    a0.command("flush")(config_command(FlushOptions, ("timeout",), _flush, [with_plugin]))
    trajectory = argument("trajectory_id", "The trajectory's id.", str)
    kind = argument("kind", "thumbs_up, thumbs_down, rating, correction, abandoned.", str)
    feedback = config_command(FeedbackOptions, None, _feedback, [with_plugin, trajectory, kind])
    a0.command("feedback")(feedback)
    a0.command("listen")(config_command(ListenOptions, ("durable",), _listen, [with_plugin]))


def plugin_config(path: Path) -> AgentZeroConfig:
    from agentrl.integrations.agent_zero.config import PLUGIN_NAME, load_config

    plugin_dir = path / "usr" / "plugins" / PLUGIN_NAME
    if not (plugin_dir / "plugin.yaml").is_file():
        raise typer.BadParameter(f"no agentrl plugin in {path} (run `agentrl agent-zero install`)")
    return load_config(plugin_dir)


def _install(cfg: InstallOptions, *, path: Path) -> None:
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

    try:
        done = install(path, None if cfg.layout == "auto" else cfg.layout)  # type: ignore[arg-type]
    except FileNotFoundError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"installed the agentrl plugin ({done.layout} layout) into {done.root}:")
    for f in done.files:
        typer.echo(f"  {f.relative_to(done.root)}")
    chosen = {**urls_from_environment(), **cfg.urls()}
    if chosen:
        try:
            saved = save_settings(done.plugin_dir, chosen)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
        typer.echo(f"\nsaved {', '.join(sorted(chosen))} in {saved}")
    plugin = load_config(done.plugin_dir)
    typer.echo(
        f"\nthe plugin publishes to NATS {plugin.nats_url} (spool {plugin.spool_path()}); "
        f"gateway {plugin.gateway_url}; control API {plugin.api_url}"
    )
    if cfg.client:
        try:
            interpreter = a0client.find_interpreter(done.root, cfg.python)
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
    ctx = served_context(plugin.gateway_url, plugin.model_name, plugin.api_token)
    typer.echo("\n" + model_settings(plugin.gateway_url, plugin.model_name, ctx))


def _flush(cfg: FlushOptions, *, path: Path) -> None:
    """Publish what the spool holds (oldest first)."""
    import asyncio

    from agentrl.integrations.agent_zero.publisher import Outbox

    outbox = Outbox(plugin_config(path))
    before = len(outbox.spool)
    sent = asyncio.run(outbox.flush(cfg.timeout, force=True))
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


def _feedback(cfg: FeedbackOptions, *, path: Path, trajectory_id: str, kind: str) -> None:
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
            rating=cfg.rating,
            comment=cfg.comment,
            correction=cfg.correction,
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from exc
    sent = asyncio.run(send_feedback(plugin_config(path), event))
    typer.echo(f"feedback {event.feedback_id} {'published' if sent else 'spooled'}")


def _listen(cfg: ListenOptions, *, path: Path) -> None:
    """Follow agent.rl.model.deployed.v1: keep Agent Zero on the gateway's public name (or,
    for another endpoint, switch to a version that takes all the traffic)."""
    import asyncio
    import signal

    from agentrl.bus import Bus
    from agentrl.integrations.agent_zero.deployment import ModelSwitcher, listen

    plugin = plugin_config(path)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with await Bus.connect(plugin.nats_url) as bus:
            await bus.ensure_streams()
            typer.echo(f"following deployments on {plugin.nats_url}; Ctrl-C stops", err=True)
            await listen(
                bus, ModelSwitcher(path), stop, cfg.durable, plugin.model_name, plugin.gateway_url
            )

    asyncio.run(run())
