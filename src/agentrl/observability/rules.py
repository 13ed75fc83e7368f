"""Prometheus alert rules (and their promtool unit tests), as data.

`agentrl observability generate` writes them to `ops/prometheus/`; `promtool check rules`
and `promtool test rules` run on the generated files in the tests.
"""

from __future__ import annotations

import re
from typing import Any

NO_TRAJECTORIES_MINUTES = 15
ERROR_RATIO_THRESHOLD = 0.05
CANARY_REWARD_MARGIN = 0.05
LAG_MIN_PENDING = 100

ALERTS: list[dict[str, Any]] = [
    {
        "alert": "AgentRLTrainingJobFailed",
        "expr": "sum by (lineage) "
        '(increase(agent_rl_training_jobs_total{status="failed"}[15m])) > 0',
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "A training job of {{ $labels.lineage }} failed",
            "description": "{{ $value }} training job(s) failed in the last 15 minutes; "
            "see GET /training and the job's error in agent.rl.training.status.v1.",
        },
    },
    {
        "alert": "AgentRLNoTrajectories",
        "expr": "(sum(increase(agent_rl_trajectories_collected_total"
        f"[{NO_TRAJECTORIES_MINUTES}m])) or vector(0)) == 0",
        "for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": f"No trajectories for {NO_TRAJECTORIES_MINUTES} minutes",
            "description": "The reward service has received no trajectories: are the agents "
            "running and publishing to agent.rl.trajectory.v1?",
        },
    },
    {
        "alert": "AgentRLDeadLettersRising",
        "expr": "sum by (subject) (increase(agent_rl_bus_dead_letters_total[10m])) > 0",
        "for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Dead letters on {{ $labels.subject }}",
            "description": "{{ $value }} messages of {{ $labels.subject }} went to RL_DLQ in "
            "10 minutes; read them with `agentrl bus dlq`.",
        },
    },
    {
        "alert": "AgentRLCanaryRewardBelowLive",
        # each lineage's canary against its own live version (a canary of one agent's
        # lineage is never compared with another lineage's live reward)
        "expr": "(agent_rl_model_reward_mean and on (lineage, model_version) "
        "(agent_rl_model_traffic_ratio > 0 and agent_rl_model_traffic_ratio < 0.5)) "
        "< on (lineage) group_left () (max by (lineage) (agent_rl_model_reward_mean and on "
        "(lineage, model_version) (agent_rl_model_traffic_ratio >= 0.5)) - "
        f"{CANARY_REWARD_MARGIN})",
        "for": "10m",
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": "Canary {{ $labels.model_version }} rewards below the live version "
            "of {{ $labels.lineage }}",
            "description": "Mean reward {{ $value }} of the canary is more than "
            f"{CANARY_REWARD_MARGIN} below the live version's; the controller should roll back.",
        },
    },
    {
        "alert": "AgentRLVersionErrorRateHigh",
        "expr": "sum by (lineage, model_version) (rate(agent_rl_gateway_errors_total[5m])) / "
        "sum by (lineage, model_version) (rate(agent_rl_gateway_requests_total[5m])) "
        f"> {ERROR_RATIO_THRESHOLD}",
        "for": "5m",
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": "Error rate of {{ $labels.model_version }} above "
            f"{ERROR_RATIO_THRESHOLD:.0%}",
            "description": "{{ $value | humanizePercentage }} of the gateway's requests to "
            "{{ $labels.model_version }} failed over 5 minutes.",
        },
    },
    {
        "alert": "AgentRLConsumerLagGrowing",
        "expr": "deriv(agent_rl_bus_consumer_pending_messages[10m]) > 0 and "
        f"agent_rl_bus_consumer_pending_messages > {LAG_MIN_PENDING}",
        "for": "10m",
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Consumer {{ $labels.consumer }} is falling behind",
            "description": "{{ $labels.consumer }} on {{ $labels.stream }} has a growing "
            "backlog: scale the service or look for a slow handler.",
        },
    },
]


def rule_file() -> dict[str, Any]:
    return {"groups": [{"name": "agentrl", "interval": "30s", "rules": ALERTS}]}


def _render(text: str, labels: dict[str, str], value: str) -> str:
    """Prometheus's template expansion for the few forms the annotations use."""
    text = re.sub(r"\{\{ \$value( \| humanizePercentage)? \}\}", value, text)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda mo: labels[mo.group(1)], text)


def _fires(name: str, value: str, **labels: str) -> list[dict[str, Any]]:
    """The alert `name` firing with `labels`, annotations expanded with `value`."""
    rule = next(a for a in ALERTS if a["alert"] == name)
    return [
        {
            "exp_labels": {**rule["labels"], **labels},
            "exp_annotations": {
                k: _render(v, labels, value) for k, v in rule["annotations"].items()
            },
        }
    ]


def unit_tests() -> dict[str, Any]:
    """promtool unit tests: each alert fires on synthetic series (and stays quiet first)."""
    return {
        "rule_files": ["agentrl.rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            _alert_test(
                "training job failed",
                {
                    'agent_rl_training_jobs_total{lineage="agentrl-policy",status="failed"}': "0 0 0 1 1 1",
                    'agent_rl_training_jobs_total{lineage="a0/dev",status="failed"}': "0 0 0 0 0 0",
                    'agent_rl_training_jobs_total{lineage="a0/dev",status="completed"}': "0 0 0 1 1 1",
                },
                "AgentRLTrainingJobFailed",
                quiet_at="2m",
                fires_at="5m",
                value="1",
                lineage="agentrl-policy",
            ),
            _alert_test(
                "no trajectories",
                {
                    'agent_rl_trajectories_collected_total{agent_type="a0",task_domain="d"}': "0+10x20 200x40"
                },
                "AgentRLNoTrajectories",
                quiet_at="20m",
                fires_at="60m",
                value="0",
            ),
            _alert_test(
                "dead letters rising",
                {
                    'agent_rl_bus_dead_letters_total{subject="agent.rl.trajectory.v1"}': "0x10 1+1x20"
                },
                "AgentRLDeadLettersRising",
                quiet_at="9m",
                fires_at="20m",
                value="10",
                subject="agent.rl.trajectory.v1",
            ),
            # lineage a: its canary falls below a's live version; lineage b: its canary is
            # above b's own live version (and below a's): quiet
            _alert_test(
                "canary reward below live",
                {
                    'agent_rl_model_traffic_ratio{lineage="a",model_version="a-v1"}': "0.9x30",
                    'agent_rl_model_traffic_ratio{lineage="a",model_version="a-v2"}': "0.1x30",
                    'agent_rl_model_reward_mean{lineage="a",model_version="a-v1"}': "0.8x30",
                    'agent_rl_model_reward_mean{lineage="a",model_version="a-v2"}': "0.8x5 0.5x25",
                    'agent_rl_model_traffic_ratio{lineage="b",model_version="b-v1"}': "0.9x30",
                    'agent_rl_model_traffic_ratio{lineage="b",model_version="b-v2"}': "0.1x30",
                    'agent_rl_model_reward_mean{lineage="b",model_version="b-v1"}': "0.3x30",
                    'agent_rl_model_reward_mean{lineage="b",model_version="b-v2"}': "0.5x30",
                },
                "AgentRLCanaryRewardBelowLive",
                quiet_at="5m",
                fires_at="25m",
                value="0.5",
                lineage="a",
                model_version="a-v2",
            ),
            _alert_test(
                "error rate of a version",
                {
                    'agent_rl_gateway_requests_total{lineage="p",model_version="p-v1"}': "0+100x30",
                    'agent_rl_gateway_errors_total{lineage="p",model_version="p-v1"}': "0+1x30",
                    'agent_rl_gateway_requests_total{lineage="p",model_version="p-v2"}': "0+100x30",
                    'agent_rl_gateway_errors_total{lineage="p",model_version="p-v2"}': "0+1x10 10+20x20",
                },
                "AgentRLVersionErrorRateHigh",
                quiet_at="9m",
                fires_at="25m",
                value="20%",
                lineage="p",
                model_version="p-v2",
            ),
            _alert_test(
                "consumer lag growing",
                {
                    'agent_rl_bus_consumer_pending_messages{stream="RL_TRAJECTORIES",consumer="rewards"}': "0x10 50+20x30",
                    'agent_rl_bus_consumer_pending_messages{stream="RL_REWARDS",consumer="warehouse"}': "500x40",
                },
                "AgentRLConsumerLagGrowing",
                quiet_at="10m",
                fires_at="35m",
                value="",
                stream="RL_TRAJECTORIES",
                consumer="rewards",
            ),
        ],
    }


def _alert_test(
    name: str,
    series: dict[str, str],
    alert: str,
    *,
    quiet_at: str,
    fires_at: str,
    value: str,
    **labels: str,
) -> dict[str, Any]:
    """One promtool test (series sampled each minute): `alert` is quiet at `quiet_at` and
    fires at `fires_at` with `labels` (its annotations expanded with `value`)."""
    return {
        "name": name,
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [
            {"eval_time": quiet_at, "alertname": alert, "exp_alerts": []},
            {
                "eval_time": fires_at,
                "alertname": alert,
                "exp_alerts": _fires(alert, value, **labels),
            },
        ],
    }
