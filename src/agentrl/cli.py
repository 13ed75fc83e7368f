"""The `agentrl` command.

Each package contributes its commands through a small `cli` module with a `register(app)`
function (every benchmark's is `agentrl.bench.cli`); this file only assembles them, so
packages stay independent and the command starts fast (heavy imports live inside commands).
`agentrl COMMAND` registers only COMMAND's plugin (`COMMANDS`); `agentrl.cli.app`, the whole
command, registers every plugin on first use.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Any

import typer
from typer.core import TyperGroup


class MenuGroup(TyperGroup):
    """Lists the commands in `MENU`'s order (commands and groups interleaved), so the panels
    of `agentrl --help` come in that order too."""

    def list_commands(self, ctx: Any) -> list[str]:
        rank = {name: i for i, name in enumerate(n for items in MENU.values() for n in items)}
        return sorted(super().list_commands(ctx), key=lambda name: rank.get(name, len(rank)))


_app = typer.Typer(
    name="agentrl",
    cls=MenuGroup,
    help=(
        "agentrl closes the reinforcement-learning loop for LLM agents: trajectories over NATS "
        "JetStream, rewards, training (GiGPO/GRPO/RLOO/PPO/DPO), validation, canary rollout "
        "through an OpenAI-compatible gateway with automatic rollback; an off-policy DQN beside "
        "it.\n\nStart with `agentrl loop` (the main job: the whole loop on the embedded stack, "
        "held-out success per version at the end) or `agentrl up` (the stack alone, for your own "
        "agents). `agentrl COMMAND --help` tells each command's story."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

# Modules that contribute commands; a missing one is skipped so a partial install still works.
PLUGINS = (
    "agentrl.contracts.cli",
    "agentrl.rewards.cli",
    "agentrl.learners.cli",
    "agentrl.offpolicy.cli",
    "agentrl.training.cli",
    "agentrl.warehouse.cli",
    "agentrl.release.cli",
    "agentrl.serving.vllm.cli",
    "agentrl.observability.cli",
    "agentrl.integrations.agent_zero.cli",
    "agentrl.app.cli",
    "agentrl.bench.cli",
)


# Each top-level command's plugin: `agentrl up` imports `agentrl.app.cli` only, not every
# plugin's options and their models (~0.6 CPU-s of each process's start; the suite starts
# dozens). A name not here registers every plugin; tests/app/test_cli_menu.py keeps it exact.
COMMANDS: dict[str, str] = {
    "schemas": "agentrl.contracts.cli",
    "rewards": "agentrl.rewards.cli",
    "train-policy": "agentrl.learners.cli",
    "train-sft": "agentrl.learners.cli",
    "learn": "agentrl.learners.cli",
    "dqn": "agentrl.offpolicy.cli",
    "train": "agentrl.training.cli",
    "stats": "agentrl.warehouse.cli",
    "warehouse": "agentrl.warehouse.cli",
    "deploy": "agentrl.release.cli",
    "lineage": "agentrl.release.cli",
    "vllm": "agentrl.serving.vllm.cli",
    "observability": "agentrl.observability.cli",
    "agent-zero": "agentrl.integrations.agent_zero.cli",
    "loop": "agentrl.app.cli",
    "up": "agentrl.app.cli",
    "report": "agentrl.app.cli",
    "demo": "agentrl.app.cli",
    "soak": "agentrl.bench.cli",
    "bench": "agentrl.bench.cli",
}
ROOT_FLAGS = ("-v", "--verbose")  # `_root`'s options, before the command's name
_registered: set[str] = set()


def _register_plugins(names: tuple[str, ...] = PLUGINS) -> None:
    from agentrl.core.plugins import optional_module

    for name in PLUGINS:  # PLUGINS' order, whatever the caller's
        if name not in names or name in _registered:
            continue
        _registered.add(name)
        module = optional_module(name)
        if module is not None:
            module.register(_app)
    _arrange_menu()


def plugins_for(args: list[str]) -> tuple[str, ...]:
    """The plugins a command line needs: its command's, or all of them (`--help`, no
    command, a name `COMMANDS` does not know)."""
    for arg in args:
        if arg in ROOT_FLAGS:
            continue
        plugin = COMMANDS.get(arg)
        return (plugin,) if plugin else PLUGINS
    return PLUGINS


app: typer.Typer  # the whole command: every plugin registered on first use (`__getattr__`)


def __getattr__(name: str) -> Any:
    """`agentrl.cli.app`: the command with every plugin registered (tests, the docs' walks of
    the command tree, a rank relaunched under torchrun)."""
    if name == "app":
        _register_plugins()
        globals()["app"] = _app
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@_app.callback()
def _root(
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="Log at DEBUG level, every record on the console (loop, learn and soak too).",
    ),
) -> None:
    from agentrl.core.logs import setup_logging

    setup_logging(logging.DEBUG if verbose else None, verbose=verbose)


# The first screen of `agentrl --help`: one line per command, grouped, the main job first; each
# command's own `--help` keeps its long text.
MENU: dict[str, dict[str, str]] = {
    "The loop": {
        "loop": "The main job: agents act, rewards, training, canary; held-out table at the end.",
        "soak": "The loop under faults: every service killed once, nothing lost or doubled.",
    },
    "Run the stack": {
        "up": "Start the embedded stack: NATS, rewards, warehouse, training, gateway, API.",
        "rewards": "Score trajectories, redact PII, run the reward service.",
        "agent-zero": "The Agent Zero plugin: install, flush its spool, feedback, listener.",
        "vllm": "vLLM as the serving engine behind the gateway: set up its environment.",
    },
    "Train": {
        "learn": "Stand-alone: train, then compare with the base on held-out tasks.",
        "train": "Training jobs of the running stack: start, status, cancel, list, serve.",
        "train-sft": "Supervised warm start on scripted demonstrations (free-form text).",
        "dqn": "Off-policy Double DQN with prioritized replay (Ape-X on Ray).",
    },
    "Deploy": {
        "deploy": "Model versions: registry, traffic split, promote, rollback, the gateway.",
        "lineage": "One lineage per agent on one base: create, list, pause, retire, map.",
    },
    "Data": {
        "warehouse": "The ClickHouse warehouse: schema, ingester, dataset export.",
        "stats": "Warehouse analytics: rewards per version, success over time, tools.",
        "schemas": "The event contracts as JSON Schema.",
    },
    "Observe": {
        "report": "The HTML report: held-out success per version, lineage, curves.",
        "observability": "Grafana dashboards and Prometheus alert rules (generated files).",
    },
    "Bench": {"bench": "Benchmarks: a table, then one JSON line of named figures."},
}


def first_sentence(text: str | None, width: int = 88) -> str | None:
    """A command's one-line summary from its docstring: the first sentence, cut at a word."""
    if not text:
        return None
    flat = " ".join(text.replace("\b", " ").split())
    flat = flat.split(". ", 1)[0].rstrip(".")
    if len(flat) > width:
        flat = flat[: width - 1].rsplit(" ", 1)[0] + "…"
    return flat


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """Every subcommand's summary in its group's help: its first sentence, not its docstring."""
    for command in typer_app.registered_commands:
        if not command.short_help:
            command.short_help = first_sentence(command.help or (command.callback or _root).__doc__)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


def _arrange_menu() -> None:
    where = {name: (panel, text) for panel, items in MENU.items() for name, text in items.items()}

    def name_of(info: Any) -> str:
        callback = getattr(info, "callback", None)
        return str(info.name or (callback.__name__.replace("_", "-") if callback else ""))

    _one_line_summaries(_app)
    infos: list[Any] = [*_app.registered_commands, *_app.registered_groups]
    for info in infos:
        panel, text = where.get(name_of(info), ("More", None))  # a plugin's own command
        info.rich_help_panel = panel
        info.short_help = text or info.short_help or first_sentence(info.help)


STOP_GRACE_S = 10.0  # clean-up's time after SIGTERM / Ctrl-C before the process ends anyway


def _sigterm_like_ctrl_c() -> None:
    """SIGTERM unwinds like Ctrl-C (KeyboardInterrupt), so every command's clean-up runs and
    stops what it started. By default SIGTERM ended the process on the spot: `agentrl bench
    serving` left its vLLM server running. (Commands with their own handlers, such as
    `agentrl up`, replace it while they run.) Either signal also arms a watchdog: asyncio.run
    and the interpreter join every worker thread at exit, and a thread nobody waits for
    held `agentrl bench gateway` for a minute after SIGTERM under load; past the grace the
    process ends (what it started dies with it: PDEATHSIG)."""
    import signal
    import threading

    armed = threading.Event()

    def end_after_grace(signum: int) -> None:
        time.sleep(STOP_GRACE_S)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(128 + signum)

    def interrupt(signum: int, frame: Any) -> None:
        if not armed.is_set():
            armed.set()
            threading.Thread(target=end_after_grace, args=(signum,), daemon=True).start()
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


def main() -> None:
    from agentrl.core.gcstart import raise_young_generation

    raise_young_generation()  # before the command's imports (torch's: -0.5 CPU-s)
    _sigterm_like_ctrl_c()
    _register_plugins(plugins_for(sys.argv[1:]))
    _app()


if __name__ == "__main__":
    main()
