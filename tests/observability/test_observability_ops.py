"""Generated ops files: current, stable uids, every expression names real metrics, and the
alert rules pass `promtool check rules` and fire in `promtool test rules`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agentrl.observability import generate
from agentrl.observability.dashboards import DATASOURCE_UID
from agentrl.observability.metrics import metric_names
from agentrl.observability.rules import ALERTS

OPS = Path(__file__).resolve().parents[2] / "ops"
PROMTOOL = shutil.which("promtool")
NO_PROMTOOL = (
    "promtool is missing: install Debian's `prometheus` package (apt-get install prometheus)"
)


def test_generated_files_are_current() -> None:
    assert generate.stale(OPS) == [], "run `agentrl observability generate` and commit ops/"


def test_five_dashboards_with_stable_uids_and_the_provisioned_datasource() -> None:
    boards = {
        p.stem: json.loads(p.read_text()) for p in (OPS / "grafana/dashboards").glob("*.json")
    }
    assert {b["title"] for b in boards.values()} == {
        "RL Training Overview",
        "Model Performance Comparison",
        "Trajectory Quality Metrics",
        "Reward Distribution",
        "Canary Rollout",
    }
    assert {b["uid"] for b in boards.values()} == {f"agentrl-{name}" for name in boards}
    for board in boards.values():
        for panel in board["panels"]:
            if panel.get("type") == "row":
                continue
            assert panel["datasource"]["uid"] == DATASOURCE_UID and panel["targets"], panel["title"]
    canary = boards["canary-rollout"]["annotations"]["list"]
    assert any("rolled_back" in a.get("expr", "") for a in canary)
    ds = yaml.safe_load((OPS / "grafana/provisioning/datasources/agentrl.yml").read_text())
    assert ds["datasources"][0]["uid"] == DATASOURCE_UID
    prov = yaml.safe_load((OPS / "grafana/provisioning/dashboards/agentrl.yml").read_text())
    assert prov["providers"][0]["type"] == "file"


def test_every_expression_names_exported_metrics() -> None:
    known = metric_names()
    exprs = generate.expressions(OPS)
    assert len(exprs) > 30
    for where, expr in exprs:
        names = set(re.findall(r"\bagent_rl_\w+", expr))
        assert names, (where, expr)
        assert names <= known, (where, names - known)


def test_alerts_cover_the_issue() -> None:
    assert {a["alert"] for a in ALERTS} == {
        "AgentRLTrainingJobFailed",
        "AgentRLNoTrajectories",
        "AgentRLDeadLettersRising",
        "AgentRLCanaryRewardBelowLive",
        "AgentRLVersionErrorRateHigh",
        "AgentRLConsumerLagGrowing",
    }


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_check_rules() -> None:
    out = subprocess.run(
        [PROMTOOL, "check", "rules", "agentrl.rules.yml"],  # type: ignore[list-item]
        cwd=OPS / "prometheus", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and "SUCCESS: 6 rules found" in out.stdout, out.stdout + out.stderr


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_unit_tests_fire_every_alert() -> None:
    tests = yaml.safe_load((OPS / "prometheus/agentrl.rules.test.yml").read_text())["tests"]
    fired = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]
    }
    quiet = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if not case["exp_alerts"]
    }
    assert fired == quiet == {a["alert"] for a in ALERTS}  # each fires, and each stays quiet first
    out = subprocess.run(
        [PROMTOOL, "test", "rules", "agentrl.rules.test.yml"],  # type: ignore[list-item]
        cwd=OPS / "prometheus", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)
def test_promtool_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests can fail: with the error-rate threshold raised they do."""
    rules = (OPS / "prometheus/agentrl.rules.yml").read_text().replace("> 0.05", "> 0.5")
    (tmp_path / "agentrl.rules.yml").write_text(rules)
    shutil.copy(OPS / "prometheus/agentrl.rules.test.yml", tmp_path)
    out = subprocess.run(
        [PROMTOOL, "test", "rules", "agentrl.rules.test.yml"],  # type: ignore[list-item]
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode != 0 and "AgentRLVersionErrorRateHigh" in out.stdout + out.stderr
