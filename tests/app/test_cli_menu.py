"""`agentrl --help`: one line per command, grouped, the main job first, nothing superseded;
no flag that reads `--no-no-...` anywhere in the command tree; `agentrl COMMAND` imports
COMMAND's plugin only."""

from __future__ import annotations

import importlib
import subprocess
import sys
from typing import Any

import typer
from typer.testing import CliRunner

from agentrl.cli import COMMANDS, MENU, PLUGINS, app, first_sentence, plugins_for

RUNNER = CliRunner()


def _help(*args: str) -> str:
    result = RUNNER.invoke(app, [*args, "--help"], env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_menu_lists_every_command_on_one_line_in_groups_main_job_first() -> None:
    out = _help()
    group: Any = typer.main.get_command(app)
    shown = [n for n, c in group.commands.items() if not c.hidden]
    in_menu = [n for items in MENU.values() for n in items]
    assert sorted(shown) == sorted(in_menu)  # every listed command has its place and line
    lines = {n: [line for line in out.splitlines() if line.startswith(f"│ {n} ")] for n in shown}
    for name, found in lines.items():
        assert len(found) == 1, (name, found)
        text = MENU[next(p for p, items in MENU.items() if name in items)][name]
        assert text in found[0]  # the whole summary on that one line: nothing wrapped
    titles = [line[3:].rstrip("─╮").strip() for line in out.splitlines() if line.startswith("╭─ ")]
    assert titles[1:] == list(MENU)  # after Options, the groups in MENU's order
    assert out.index("│ loop ") < min(out.index(f"│ {n} ") for n in shown if n != "loop")
    for retired in ("demo", "train-policy"):
        assert f"│ {retired} " not in out


def _walk(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    for name, sub in getattr(command, "commands", {}).items():  # a group (typer's own click)
        out += _walk(sub, (*path, name))
    return out


def test_no_flag_reads_no_no() -> None:
    root: Any = typer.main.get_command(app)
    paths = _walk(root)
    assert ("bench", "gateway") in paths and ("up",) in paths  # the whole tree is walked
    flags = 0
    for path in paths:
        command = root
        for name in path:
            command = command.commands[name]
        for param in command.params:
            for flag in [*param.opts, *param.secondary_opts]:
                flags += 1
                assert not flag.startswith("--no-no-"), (path, flag)
    assert flags > 200


def test_first_sentence_is_one_short_line() -> None:
    assert first_sentence("Run it. Then more.") == "Run it"
    long = first_sentence("word " * 40)
    assert long is not None and len(long) <= 88 and long.endswith("…")
    assert first_sentence(None) is None


def _names(plugin: str) -> set[str]:
    """The top-level commands and groups `plugin` registers."""
    one = typer.Typer()
    importlib.import_module(plugin).register(one)
    commands = {c.name or c.callback.__name__.replace("_", "-") for c in one.registered_commands}
    return commands | {str(g.name) for g in one.registered_groups}


def test_a_command_registers_its_own_plugin_only() -> None:
    """`COMMANDS` names exactly what each plugin registers: a name missing there would still
    run (every plugin registered), one under the wrong plugin would not."""
    for plugin in PLUGINS:
        assert _names(plugin) == {n for n, p in COMMANDS.items() if p == plugin}, plugin
    assert plugins_for(["-v", "up", "--data-dir", "x"]) == ("agentrl.app.cli",)
    assert plugins_for(["--help"]) == plugins_for([]) == plugins_for(["nope"]) == PLUGINS
    # one process as `agentrl up --help` starts: no other plugin, no torch
    code = (
        "import sys\n"
        "from agentrl import cli\n"
        "sys.argv = ['agentrl', 'up', '--help']\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in [*cli.PLUGINS, 'torch'] if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "--data-dir" in proc.stdout  # up's own help, whole
    assert proc.stdout.strip().splitlines()[-1] == "['agentrl.app.cli']", proc.stdout[-2000:]


def test_python_m_agentrl_reads_the_torchrun_argv_of_the_distributed_module() -> None:
    from agentrl.llm.distributed import CLI_ARGV_ENV

    main = importlib.import_module("agentrl.__main__")
    assert main.CLI_ARGV_ENV == CLI_ARGV_ENV
