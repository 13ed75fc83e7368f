"""`agentrl up --help` says how to point a client at it. The `up` that starts every service,
answers, and stops on SIGINT while streams decode is tested in
tests/capture/test_stack_capture.py, beside the capture path on the same `up` (one `up` with the
tiny model for both: ~12 CPU-s of the suite less)."""

from __future__ import annotations

from typer.testing import CliRunner


def test_up_help_says_how_to_point_an_openai_client_and_agent_zero() -> None:
    # in this process (typer's runner): a new Python and the CLI's imports cost ~1 CPU-s
    from agentrl.cli import app

    out = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "120"})
    assert out.exit_code == 0, out.output[-3000:]
    for needle in ("base_url=", "/v1", "agentrl-policy", "agent-zero install", "--data-dir"):
        assert needle in out.stdout, needle
