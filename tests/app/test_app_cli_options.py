"""`agentrl up` and `agentrl report` draw their options from `agentrl.app.options` (issue
55.3): each field is an option helped by its docstring, an option not given leaves the
field unset (no `--port 0`, `--cluster 0` or `--gateway-workers 0` meaning "the default"),
and a refused value exits 2 before anything starts."""

from __future__ import annotations

import pytest

from agentrl.app.options import ReportOptions, UpOptions
from agentrl.cli import app
from config_cli_check import RUNNER, check_fields, shown


def test_up_options_are_the_fields_of_up_options() -> None:
    text = check_fields(["up"], UpOptions, every_option=True, all_described=True)
    assert "--no-services " in text and "--data-dir " in text  # the flags keep their names
    got = shown(["up", "--no-services", "--port", "4222", "--cluster", "3", "--replicas", "2"])
    assert (got["services"], got["port"], got["cluster"], got["replicas"]) == (False, 4222, 3, 2)
    assert (got["gateway_workers"], got["data_dir"]) == (None, None)


def test_report_options_are_the_fields_of_report_options() -> None:
    page = RUNNER.invoke(app, ["report", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    text = " ".join(page.output.replace("│", " ").split())
    for name, info in ReportOptions.model_fields.items():
        assert f"--{name.replace('_', '-')} " in text and info.description, name
    assert "[required]" in text  # --out
    got = shown(["report", "--out", "r"])
    assert got == {"out": "r", "source": "auto", "nats_url": None, "hours": 168.0}
    got = shown(["report", "--out", "r", "--source", "streams", "--hours", "2"])
    assert (got["source"], got["hours"]) == ("streams", 2.0)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["up", "--port", "0"], "port"),  # 0 no longer means "a free one": leave it unset
        (["up", "--cluster", "0"], "cluster"),
        (["up", "--gateway-workers", "0"], "gateway_workers"),
        (["up", "--replicas", "0"], "replicas"),
        (["report"], "Missing option '--out'"),
        (["report", "--out", "r", "--source", "web"], "web"),
        (["report", "--out", "r", "--hours", "0"], "hours"),
    ],
)
def test_bad_values_exit_2_with_the_reason(args: list[str], why: str) -> None:
    result = RUNNER.invoke(app, [*args, "--show-config"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and why in result.output, result.output


def test_up_refuses_gateway_workers_it_cannot_serve_before_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--gateway-workers 2` reaches the deploy settings; with capture on (the default) it
    is refused with the reason, exit 2, before any server starts."""
    monkeypatch.setenv("AGENTRL_DEPLOY_GATEWAY_WORKERS", "1")  # restored after the test
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("AGENTRL_CAPTURE_ENABLED", raising=False)
    result = RUNNER.invoke(app, ["up", "--gateway-workers", "2"])
    assert result.exit_code == 2, result.output
    assert "--gateway-workers 2" in result.output and "capture" in result.output.lower()


def test_the_retired_demo_keeps_its_data_dir_option() -> None:
    page = RUNNER.invoke(app, ["demo", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert page.exit_code == 0 and "--data-dir" in page.output and "Retired" in page.output
