"""`agentrl bench NAME` and `agentrl soak` are rows of a table (issue 55.3): each row's options
are its model's fields (helped by their docstrings, the model's docstring the command's help),
unset options keep the model's defaults, no option's 0 means "the default", a refused value
exits 2, and every row's run function exists and takes its model."""

from __future__ import annotations

import importlib
import inspect
import json
import re
from pathlib import Path

import pytest

from agentrl.bench import options as o
from agentrl.bench.cli import BENCHES, Bench
from agentrl.bench.soak_config import SoakConfig
from agentrl.cli import app
from agentrl.core.configcli import first_sentence
from config_cli_check import RUNNER, check_fields, shown

DRAWN = [row for row in BENCHES if isinstance(row, Bench)]


@pytest.mark.parametrize("row", DRAWN, ids=lambda row: row.name)
def test_every_row_runs_a_function_that_takes_its_model(row: Bench) -> None:
    module, _, name = row.run.partition(":")
    run = getattr(importlib.import_module(module), name)
    (first, *_) = inspect.signature(run).parameters.values()
    assert str(first.annotation).rsplit(".", 1)[-1] == row.options.__name__, row.run
    summary = first_sentence(row.options.__doc__)
    assert summary and not re.match(r"`agentrl bench [a-z-]+`[.:]", summary), row.name  # a story


@pytest.mark.parametrize(
    ("command", "model"),
    [
        (["bench", "bus"], o.BusBench),
        (["bench", "gigpo"], o.GigpoBench),
        (["bench", "rollout"], o.RolloutBench),
        (["bench", "lineages"], o.LineagesBench),
        (["bench", "canary"], o.CanaryBench),
        (["bench", "gateway"], o.GatewayBench),
        (["bench", "structured"], o.StructuredBench),
        (["bench", "serving"], o.ServingBench),
        (["bench", "metrics"], o.MetricsBench),
        (["bench", "capture"], o.CaptureBench),
        (["bench", "startup"], o.StartupBench),
        (["bench", "choice"], o.ChoiceBench),
    ],
    ids=lambda x: x[-1] if isinstance(x, list) else "",
)
def test_every_field_is_an_option_helped_by_its_docstring(command: list[str], model: type) -> None:
    every = model is not o.StructuredBench  # its n_schemas keeps its old flag, --schemas
    text = check_fields(command, model, every_option=every, all_described=True)
    assert " ".join(model.__doc__.split("\n\n")[0].split()) in text  # the command's story


def test_the_old_flags_and_the_quick_profiles_stay() -> None:
    assert shown(["bench", "bus", "--quick"])["n"] == 20_000
    assert shown(["bench", "bus", "--quick", "--n", "7"])["n"] == 7  # was "--n 0: --quick's"
    canary = shown(["bench", "canary", "--quick", "--runs", "5"])
    assert (canary["runs"], canary["worse_runs"], canary["small_runs"]) == (5, 4, 4)
    assert shown(["bench", "structured", "--schemas", "3"])["n_schemas"] == 3
    serving = shown(["bench", "serving", "--no-prefix", "--no-multilora", "--budget-s", "8"])
    assert (serving["prefix"], serving["multilora"], serving["budget_s"]) == (False, False, 8.0)
    assert shown(["bench", "serving", "--set", "budget_s=null"])["budget_s"] is None  # no bound
    rollout = shown(["bench", "rollout", "--set", "history_window=null", "--threads", "2"])
    assert (rollout["history_window"], rollout["threads"]) == (None, 2)
    gateway = shown(["bench", "gateway", "--peers", "--only", "", "--interleave", "3"])
    assert (gateway["peers"], gateway["only"], gateway["interleave"]) == (True, "", 3)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["bench", "gateway", "--interleave", "0"], "interleave"),  # was "0: not interleaved"
        (["bench", "bus", "--cluster", "1"], "cluster"),  # was "0: no cluster"
        (["bench", "rollout", "--threads", "0"], "threads"),  # was "0: torch's default"
        (["bench", "serving", "--budget-s", "0"], "budget_s"),  # was "0: no bound"
        (["bench", "capture", "--otlp-traces", "5"], "otlp_traces"),
        (["soak", "--cluster", "0"], "cluster"),  # was "0: one server"
    ],
)
def test_a_refused_value_exits_2_with_the_reason(args: list[str], why: str) -> None:
    result = RUNNER.invoke(app, [*args, "--show-config"])
    assert result.exit_code == 2 and why in result.output, result.output


def test_the_soak_quick_profile_applies_to_the_replicated_soak_only() -> None:
    assert shown(["soak", "--quick"]) == json.loads(SoakConfig().model_dump_json())
    quick = shown(["soak", "--quick", "--replicas", "2", "--threshold", "12"])
    assert (quick["agents"], quick["threshold"], quick["settle_s"]) == (1, 12, 3.0)


def test_the_soak_refuses_a_folder_in_use(tmp_path: Path) -> None:
    (tmp_path / "left.txt").write_text("another run's")
    result = RUNNER.invoke(app, ["soak", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "not empty" in result.output, result.output


def test_observability_generate_writes_then_checks(tmp_path: Path) -> None:
    check_fields(["observability", "generate"], _generate_options(), every_option=True)
    stale = RUNNER.invoke(app, ["observability", "generate", "--out", str(tmp_path), "--check"])
    assert stale.exit_code == 1 and "stale generated files" in stale.output
    wrote = RUNNER.invoke(app, ["observability", "generate", "--out", str(tmp_path)])
    assert wrote.exit_code == 0 and "wrote" in wrote.output, wrote.output
    current = RUNNER.invoke(app, ["observability", "generate", "--out", str(tmp_path), "--check"])
    assert current.exit_code == 0 and "current" in current.output


def test_schemas_export_writes_one_file_per_subject(tmp_path: Path) -> None:
    result = RUNNER.invoke(app, ["schemas", "export", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in tmp_path.glob("*.json"))
    assert "agent.rl.trajectory.v1.json" in written and len(written) == len(result.output.split())


def _generate_options() -> type:
    from agentrl.observability.cli import GenerateOptions

    return GenerateOptions


def test_the_command_tree_loads_no_benchmark_and_no_numeric_library() -> None:
    """`agentrl --help` stays fast: building every command (the benchmarks' options
    included) imports no benchmark module, no numpy or torch, and not the reward core."""
    import subprocess
    import sys

    code = (
        "import sys, typer; from agentrl.cli import app; typer.main.get_command(app); "
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    ours = {"agentrl.bench", "agentrl.bench.cli", "agentrl.bench.options"}
    benches = [m for m in loaded if m.startswith("agentrl.bench") and m not in ours]
    assert benches == ["agentrl.bench.soak_config"]  # `agentrl soak`'s options
    heavy = {"numpy", "torch", "agentrl.rewards.calculator"} & set(loaded)
    assert not heavy, heavy
