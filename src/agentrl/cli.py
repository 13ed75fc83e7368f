"""The `agentrl` command.

Each package contributes its commands through a small `cli` module with a
`register(app, bench)` function; this file only assembles them, so packages stay
independent and the command starts fast (heavy imports live inside commands).
"""

from __future__ import annotations

import logging

import typer

app = typer.Typer(
    name="agentrl",
    help=(
        "agentrl closes the reinforcement-learning loop for LLM agents: trajectories over NATS "
        "JetStream, rewards, policy training (GiGPO/GRPO/RLOO/PPO/DPO), and an off-policy DQN "
        "trainer.\n\nStart with `agentrl up` to run the embedded stack, or `agentrl --help` on "
        "any command."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
bench_app = typer.Typer(
    help=(
        "Benchmarks. Each prints a readable table and, as its last line, one JSON object of "
        "named figures (record them in BENCHMARKS.md)."
    ),
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")

# Modules that contribute commands; a missing one is skipped so a partial install still works.
PLUGINS = (
    "agentrl.bus.cli",
    "agentrl.contracts.cli",
    "agentrl.rewards.cli",
    "agentrl.advantages.cli",
    "agentrl.rollout.cli",
    "agentrl.llm.cli",
    "agentrl.offpolicy.cli",
    "agentrl.demo.cli",
    "agentrl.training.cli",
    "agentrl.warehouse.cli",
    "agentrl.deploy.cli",
    "agentrl.deploy.vllm.cli",
    "agentrl.observability.cli",
    "agentrl.integrations.agent_zero.cli",
    "agentrl.loop_cli",
    "agentrl.soak_cli",
    "agentrl.capture.cli",
)


def _register_plugins() -> None:
    from agentrl.plugins import optional_module

    for name in PLUGINS:
        module = optional_module(name)
        if module is not None:
            module.register(app, bench_app)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level."),
) -> None:
    from agentrl.logs import setup_logging

    setup_logging(logging.DEBUG if verbose else None)


_register_plugins()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
