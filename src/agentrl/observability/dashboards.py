"""The five Grafana dashboards, as code (grafana-foundation-sdk builders).

`agentrl observability generate` writes them (and the provisioning files) under `ops/`;
the generated JSON is committed so Grafana can be provisioned without Python. Every
dashboard has a stable uid and uses the provisioned Prometheus datasource by its fixed uid.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery,
    Dashboard,
    QueryVariable,
    Row,
)
from grafana_foundation_sdk.builders.heatmap import Panel as Heatmap
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableOption, VariableRefresh
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DATASOURCE_UID = "agentrl-prometheus"
DATASOURCE = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
RATE = "[5m]"
# the lineage variable's selector (a lineage: a public model name with its own versions)
LIN = '{lineage=~"$lineage"}'


def lineage_variable() -> QueryVariable:
    """`$lineage`: one, several or all lineages (All: `.*`), from the traffic ratios'
    labels (every served lineage has one), so the per-version panels show them apart."""
    return (
        QueryVariable("lineage")
        .label("Lineage")
        .datasource(DATASOURCE)
        .query("label_values(agent_rl_model_traffic_ratio, lineage)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(VariableOption(selected=True, text="All", value="$__all"))
    )


def q(expr: str, legend: str = "", ref: str = "A") -> Dataquery:
    query = Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    return query.legend_format(legend) if legend else query


def ts(title: str, unit: str, *queries: Dataquery, w: int = 12, h: int = 8) -> Timeseries:
    panel = Timeseries().title(title).unit(unit).datasource(DATASOURCE).span(w).height(h)
    for query in queries:
        panel = panel.with_target(query)
    return panel


def stat(title: str, unit: str, query: Dataquery, w: int = 6) -> Stat:
    return (
        Stat().title(title).unit(unit).datasource(DATASOURCE).span(w).height(4).with_target(query)
    )


def heat(title: str, query: Dataquery, w: int = 12) -> Heatmap:
    return (
        Heatmap()
        .title(title)
        .datasource(DATASOURCE)
        .span(w)
        .height(8)
        .with_target(query.format(PromQueryFormat.HEATMAP))
    )


def base(uid: str, title: str, description: str, lineages: bool = True) -> Dashboard:
    """A dashboard; with `lineages`, its `$lineage` variable (panels filter by it)."""
    board = (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["agentrl", "generated"])
        .refresh("30s")
        .time("now-6h", "now")
        .editable()
    )
    return board.with_variable(lineage_variable()) if lineages else board


def training_overview() -> Dashboard:
    return (
        base(
            "agentrl-training-overview",
            "RL Training Overview",
            "Training jobs: outcomes, queue, duration, samples and the running job's curve.",
        )
        .with_row(Row("Jobs"))
        .with_panel(stat("Jobs queued", "short", q("sum(agent_rl_training_queue_depth)")))
        .with_panel(stat("Jobs running", "short", q("sum(agent_rl_training_jobs_running)")))
        .with_panel(
            stat(
                "Jobs failed (24h)",
                "short",
                q(
                    'sum(increase(agent_rl_training_jobs_total{status="failed",'
                    'lineage=~"$lineage"}[24h]))'
                ),
            )
        )
        .with_panel(
            stat(
                "Jobs completed (24h)",
                "short",
                q(
                    'sum(increase(agent_rl_training_jobs_total{status="completed",'
                    'lineage=~"$lineage"}[24h]))'
                ),
            )
        )
        .with_panel(
            ts(
                "Job outcomes per hour",
                "short",
                q(
                    f"sum by (lineage, status) (increase(agent_rl_training_jobs_total{LIN}[1h]))",
                    "{{lineage}} {{status}}",
                ),
            )
        )
        .with_panel(
            ts(
                "Job duration (p50, p95)",
                "s",
                q(
                    "histogram_quantile(0.5, sum by (le) (rate(agent_rl_training_duration_seconds_bucket[1h])))",
                    "p50",
                ),
                q(
                    "histogram_quantile(0.95, sum by (le) (rate(agent_rl_training_duration_seconds_bucket[1h])))",
                    "p95",
                    "B",
                ),
            )
        )
        .with_row(Row("Running job"))
        .with_panel(
            ts("Training reward (mean)", "short", q("agent_rl_training_reward_mean", "reward"))
        )
        .with_panel(ts("Training loss", "short", q("agent_rl_training_loss", "loss")))
        .with_panel(
            ts(
                "Optimiser steps per second",
                "ops",
                q(f"sum(rate(agent_rl_training_steps_total{RATE}))", "steps/s"),
            )
        )
        .with_panel(
            ts(
                "Samples per job (p50)",
                "short",
                q(
                    "histogram_quantile(0.5, sum by (le) (rate(agent_rl_training_samples_bucket[6h])))",
                    "p50",
                ),
            )
        )
    )


def model_performance() -> Dashboard:
    return (
        base(
            "agentrl-model-performance",
            "Model Performance Comparison",
            "Reward, success rate, benchmark scores, latency and errors per model version.",
        )
        .with_panel(
            ts(
                "Mean reward per version (monitor window)",
                "short",
                q(f"agent_rl_model_reward_mean{LIN}", "{{lineage}} {{model_version}}"),
            )
        )
        .with_panel(
            ts(
                "Mean trajectory reward per version",
                "short",
                q(
                    f"sum by (lineage, model_version) "
                    f"(rate(agent_rl_trajectory_reward_sum{LIN}{RATE})) / "
                    f"sum by (lineage, model_version) "
                    f"(rate(agent_rl_trajectory_reward_count{LIN}{RATE}))",
                    "{{lineage}} {{model_version}}",
                ),
            )
        )
        .with_panel(
            ts(
                "Success rate per version",
                "percentunit",
                q(
                    f"sum by (lineage, model_version) "
                    f"(rate(agent_rl_trajectory_success_total{LIN}{RATE})) / "
                    f"sum by (lineage, model_version) "
                    f"(rate(agent_rl_trajectory_reward_count{LIN}{RATE}))",
                    "{{lineage}} {{model_version}}",
                ),
            )
        )
        .with_panel(
            ts(
                "Benchmark score by task type",
                "percentunit",
                q(
                    f"agent_rl_model_benchmark_score{LIN}",
                    "{{lineage}} {{model_version}} {{task_type}}",
                ),
            )
        )
        .with_panel(
            ts(
                "Gateway latency p95 per version",
                "s",
                q(
                    "histogram_quantile(0.95, sum by (le, lineage, model_version) "
                    f"(rate(agent_rl_gateway_request_duration_seconds_bucket{LIN}{RATE})))",
                    "{{lineage}} {{model_version}}",
                ),
            )
        )
        .with_panel(
            ts(
                "Error ratio per version",
                "percentunit",
                q(
                    f"sum by (lineage, model_version) "
                    f"(rate(agent_rl_gateway_errors_total{LIN}{RATE})) / "
                    f"sum by (lineage, model_version) "
                    f"(rate(agent_rl_gateway_requests_total{LIN}{RATE}))",
                    "{{lineage}} {{model_version}}",
                ),
            )
        )
    )


def trajectory_quality() -> Dashboard:
    return (
        base(
            "agentrl-trajectory-quality",
            "Trajectory Quality Metrics",
            "Trajectory volume and length, dead letters, bus lag and reward-service latency.",
            lineages=False,
        )
        .with_panel(
            ts(
                "Trajectories per second",
                "ops",
                q(
                    "sum by (agent_type, task_domain) "
                    f"(rate(agent_rl_trajectories_collected_total{RATE}))",
                    "{{agent_type}} / {{task_domain}}",
                ),
            )
        )
        .with_panel(
            ts(
                "Turns per trajectory (p50, p95)",
                "short",
                q(
                    "histogram_quantile(0.5, sum by (le) "
                    f"(rate(agent_rl_trajectory_length_turns_bucket{RATE})))",
                    "p50",
                ),
                q(
                    "histogram_quantile(0.95, sum by (le) "
                    f"(rate(agent_rl_trajectory_length_turns_bucket{RATE})))",
                    "p95",
                    "B",
                ),
            )
        )
        .with_panel(
            ts(
                "Dead letters per second by subject",
                "ops",
                q(f"sum by (subject) (rate(agent_rl_bus_dead_letters_total{RATE}))", "{{subject}}"),
            )
        )
        .with_panel(
            ts(
                "Consumer lag (pending) and redeliveries",
                "short",
                q("agent_rl_bus_consumer_pending_messages", "pending {{consumer}}"),
                q("agent_rl_bus_consumer_redelivered_messages", "redelivered {{consumer}}", "B"),
            )
        )
        .with_panel(
            ts(
                "Reward service latency (p50, p99)",
                "s",
                q(
                    "histogram_quantile(0.5, sum by (le) "
                    f"(rate(agent_rl_reward_latency_seconds_bucket{RATE})))",
                    "p50",
                ),
                q(
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(agent_rl_reward_latency_seconds_bucket{RATE})))",
                    "p99",
                    "B",
                ),
            )
        )
        .with_panel(
            ts(
                "Stream depth",
                "short",
                q("agent_rl_bus_stream_messages", "{{stream}}"),
            )
        )
        .with_panel(
            ts(
                "Warehouse insert batch rows (p50) and latency (p95)",
                "short",
                q(
                    "histogram_quantile(0.5, sum by (le, table) "
                    f"(rate(agent_rl_warehouse_insert_batch_rows_bucket{RATE})))",
                    "rows {{table}}",
                ),
                q(
                    "histogram_quantile(0.95, sum by (le, table) "
                    f"(rate(agent_rl_warehouse_insert_duration_seconds_bucket{RATE})))",
                    "seconds {{table}}",
                    "B",
                ),
            )
        )
        .with_panel(
            ts(
                "Bus messages published and consumed per second",
                "ops",
                q(
                    f"sum by (subject) (rate(agent_rl_bus_published_messages_total{RATE}))",
                    "pub {{subject}}",
                ),
                q(
                    f"sum by (consumer) (rate(agent_rl_bus_consumed_messages_total{RATE}))",
                    "ack {{consumer}}",
                    "B",
                ),
            )
        )
    )


def reward_distribution() -> Dashboard:
    return (
        base(
            "agentrl-reward-distribution",
            "Reward Distribution",
            "Distribution of trajectory rewards and of each reward component over time.",
        )
        .with_panel(
            heat(
                "Trajectory reward distribution",
                q(
                    f"sum by (le) (increase(agent_rl_trajectory_reward_bucket{LIN}{RATE}))",
                    "{{le}}",
                ),
            )
        )
        .with_panel(
            heat(
                "Reward component distribution",
                q(f"sum by (le) (increase(agent_rl_reward_component_bucket{RATE}))", "{{le}}"),
            )
        )
        .with_panel(
            ts(
                "Mean of each reward component",
                "short",
                q(
                    f"sum by (component) (rate(agent_rl_reward_component_sum{RATE})) / "
                    f"sum by (component) (rate(agent_rl_reward_component_count{RATE}))",
                    "{{component}}",
                ),
            )
        )
        .with_panel(
            ts(
                "Rewards published per second",
                "ops",
                q(f"sum(rate(agent_rl_rewards_published_total{RATE}))", "rewards/s"),
            )
        )
    )


def canary_rollout() -> Dashboard:
    rollback = (
        AnnotationQuery()
        .name("Rollbacks")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("red")
        .expr(
            'sum by (lineage) (increase(agent_rl_model_deployments_total{status="rolled_back",'
            'lineage=~"$lineage"}[1m])) > 0'
        )
    )
    promote = (
        AnnotationQuery()
        .name("Promotions")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("green")
        .expr(
            'sum by (lineage) (increase(agent_rl_model_deployments_total{status="promoted",'
            'lineage=~"$lineage"}[1m])) > 0'
        )
    )
    return (
        base(
            "agentrl-canary-rollout",
            "Canary Rollout",
            "Traffic split and reward per version during a canary, with rollback markers.",
        )
        .annotation(rollback)
        .annotation(promote)
        .with_panel(
            ts(
                "Traffic ratio per version (of its lineage's traffic)",
                "percentunit",
                q(f"agent_rl_model_traffic_ratio{LIN}", "{{lineage}} {{model_version}}"),
                w=24,
            )
        )
        .with_panel(
            ts(
                "Reward per version",
                "short",
                q(f"agent_rl_model_reward_mean{LIN}", "{{lineage}} {{model_version}}"),
            )
        )
        .with_panel(
            ts(
                "Error ratio per version",
                "percentunit",
                q(
                    f"sum by (lineage, model_version) "
                    f"(rate(agent_rl_gateway_errors_total{LIN}{RATE})) / "
                    f"sum by (lineage, model_version) "
                    f"(rate(agent_rl_gateway_requests_total{LIN}{RATE}))",
                    "{{lineage}} {{model_version}}",
                ),
            )
        )
        .with_panel(
            ts(
                "Deployments by status per hour",
                "short",
                q(
                    "sum by (lineage, status) "
                    f"(increase(agent_rl_model_deployments_total{LIN}[1h]))",
                    "{{lineage}} {{status}}",
                ),
                w=24,
            )
        )
    )


DASHBOARDS = {
    "training-overview": training_overview,
    "model-performance": model_performance,
    "trajectory-quality": trajectory_quality,
    "reward-distribution": reward_distribution,
    "canary-rollout": canary_rollout,
}


def build_all() -> dict[str, Any]:
    """{file stem: built dashboard model}."""
    return {name: make().build() for name, make in DASHBOARDS.items()}
