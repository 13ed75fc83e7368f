"""The reward commands' options are drawn from `agentrl.rewards.options` (issue 55.3): each
chosen field is an option helped by its docstring, `--set` reaches the others, unset
options keep the model's defaults (or `--quick`'s), and a refused value exits 2."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from agentrl.cli import app
from agentrl.rewards.options import RedactionBench, RewardsBench, ScoreOptions, ServeOptions
from config_cli_check import RUNNER, check_fields, shown

COMMANDS = [
    (["rewards", "serve"], ServeOptions),
    (["rewards", "score"], ScoreOptions),
    (["bench", "rewards"], RewardsBench),
    (["bench", "redaction"], RedactionBench),
]


_shown = shown


@pytest.mark.parametrize(("command", "model"), COMMANDS)
def test_every_field_is_reachable_and_helped_by_its_docstring(
    command: list[str], model: type[BaseModel]
) -> None:
    text = check_fields(command, model, all_described=True)
    assert "--set" in text


def test_options_set_and_quick_override_the_defaults() -> None:
    args = ["rewards", "serve", "--batch", "64", "--ack-wait", "3", "--set", "max_inflight=2"]
    got = _shown(args)
    assert (got["batch"], got["ack_wait"], got["max_inflight"], got["durable"]) == (
        64, 3.0, 2, "rewards",
    )  # fmt: skip
    quick = _shown(["bench", "rewards", "--quick", "--n", "500"])
    assert quick == {**json.loads(RewardsBench.quick().model_dump_json()), "n": 500}
    assert _shown(["bench", "rewards"])["n"] == 50_000  # no "0 means default" any more


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["bench", "rewards", "--replicas", "0"], "replicas"),
        (["bench", "rewards", "--n", "0"], "greater than or equal to 1"),
        (["rewards", "score", "--demo", "0"], "demo"),
        (["rewards", "serve", "--batch", "many"], "--batch"),
        (["rewards", "serve", "--set", "nope=1"], "FIELD=VALUE"),
        (["bench", "redaction", "--set", "n"], "FIELD=VALUE"),
    ],
)
def test_bad_input_exits_2_with_the_reason(args: list[str], why: str) -> None:
    result = RUNNER.invoke(app, [*args, "--show-config"])
    assert result.exit_code == 2 and why in result.output, result.output


def test_score_runs_on_the_drawn_options() -> None:
    result = RUNNER.invoke(app, ["rewards", "score", "--demo", "2"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 2 and all("total_reward" in line for line in lines)
    assert RUNNER.invoke(app, ["rewards", "score"]).exit_code == 2  # neither file nor --demo


def test_the_bench_figures_come_from_the_phase_rows() -> None:
    from agentrl.bench.rewards import phase_figures, replica_figures

    def row(per_s: float, cpu: float, replicas: int = 1) -> dict[str, object]:
        return {"per_s": per_s, "service_cpu_us": cpu, "lost": 0, "duplicates": 0,
                "p99_ms": 9.0, "paced_rate": 50.0, "p99_saturated_ms": 90.0,
                "complete": True, "replicas": replicas}  # fmt: skip

    # phases: plain, metrics off, code, peer, metrics off #2, plain #2 (ABBA)
    rows = [row(100, 12), row(110, 10), row(20, 400), row(300, 3), row(130, 10), row(120, 12)]
    got = phase_figures(rows, 1000, 100)
    assert (got["trajectories_per_s"], got["code_trajectories_per_s"]) == (100.0, 20.0)
    assert got["metrics_on_trajectories_per_s"] == 110.0  # (100 + 120) / 2
    assert got["metrics_overhead_fraction"] == 0.2 and got["complete"] and got["n_code"] == 100
    many = replica_figures([row(100, 10), row(150, 8, 2), row(170, 8, 2), row(120, 10)], 2, 9)
    assert (many["one_replica_trajectories_per_s"], many["replicas_trajectories_per_s"]) == (
        110.0, 160.0,
    )  # fmt: skip
    assert many["ratio"] == round(160 / 110, 3) and many["shows_scale_out"] is False
