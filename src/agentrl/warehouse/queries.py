"""Analytics over the warehouse: each query is one SQL text (same on chdb and a server).

Counts are exact before merges: tables are read with FINAL (redelivered rows collapse at
read time) and rewards with argMax over the version (the latest reward of a trajectory wins).
Every function returns plain rows (list of dicts) so the CLI, the HTTP API and the canary
monitor share them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from agentrl.warehouse.backend import Backend

# Redelivered rows always fall into the partition of their first copy (partitions are a
# function of the event's own timestamp), so FINAL may collapse within partitions only:
# parts of different days are then read in parallel without a merge across them.
READ_SETTINGS = "\nSETTINGS do_not_merge_across_partitions_select_final = 1"


def latest_rewards_sql(database: str, having: str = "1") -> str:
    """The latest reward version of each trajectory, keyed by `tkey` (cityHash64 of the id)."""
    return (
        f"SELECT tkey, argMax(total_reward, version) AS reward, max(version) AS reward_version, "
        f"argMax(correction, version) AS correction, "
        f"argMax(turn_rewards, version) AS turn_rewards "
        f"FROM {database}.rewards GROUP BY tkey HAVING {having}"
    )


TS_MIN = datetime(1900, 1, 1, tzinfo=UTC)
TS_MAX = datetime(2299, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)


def ts_param(value: datetime) -> str:
    """A DateTime64(3) query parameter (UTC), accepted by chdb and clickhouse-connect.

    Bounds outside DateTime64's range (1900..2299) are clamped to it: as a filter bound they
    mean the same."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    value = min(max(value.astimezone(UTC), TS_MIN), TS_MAX)
    return (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{value.microsecond // 1000:03d}"
    )


def _window(
    column: str, since: datetime | None, until: datetime | None, params: dict[str, Any]
) -> str:
    parts = []
    if since is not None:
        params["since"] = ts_param(since)
        parts.append(f"{column} >= {{since:DateTime64(3)}}")
    if until is not None:
        params["until"] = ts_param(until)
        parts.append(f"{column} <= {{until:DateTime64(3)}}")
    return " AND ".join(parts) if parts else "1"


class Analytics:
    """The warehouse's questions, asked of one backend and database."""

    def __init__(self, backend: Backend, database: str = "agentrl") -> None:
        self.backend = backend
        self.db = database

    def _rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.backend.query(
            sql + READ_SETTINGS, params or None
        ).to_pylist()
        return rows

    def _latest_rewards(self) -> str:
        return latest_rewards_sql(self.db)

    def counts(self) -> dict[str, int]:
        """Rows per table after collapsing redeliveries (distinct events)."""
        tables = (
            "trajectories",
            "turns",
            "rewards",
            "feedback",
            "training_jobs",
            "deployments",
            "model_versions",
        )
        sql = " UNION ALL ".join(
            f"SELECT '{t}' AS name, count() AS n FROM {self.db}.{t} FINAL" for t in tables
        )
        return {r["name"]: int(r["n"]) for r in self._rows(sql)}

    def reward_distribution(
        self, since: datetime | None = None, until: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Per model version and domain: count, mean, std, min, p10, p50, p90, max of the
        latest reward of each trajectory."""
        params: dict[str, Any] = {}
        where = _window("end_timestamp", since, until, params)
        sql = f"""
            SELECT t.model AS model, t.domain AS domain, count() AS trajectories,
                   avg(r.reward) AS mean, stddevPop(r.reward) AS std,
                   min(r.reward) AS min, quantileExact(0.1)(r.reward) AS p10,
                   quantileExact(0.5)(r.reward) AS p50, quantileExact(0.9)(r.reward) AS p90,
                   max(r.reward) AS max
            FROM (SELECT tkey, model, domain FROM {self.db}.trajectories FINAL
                  WHERE {where}) AS t
            INNER JOIN ({self._latest_rewards()}) AS r USING tkey
            GROUP BY model, domain ORDER BY model, domain"""
        return self._rows(sql, params)

    def success_over_time(
        self,
        bucket_s: int = 3600,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Per model version and time bucket: trajectories, success rate, mean reward (of
        the rewarded ones) — what the canary monitor compares between versions."""
        params: dict[str, Any] = {"bucket": int(bucket_s)}
        where = _window("end_timestamp", since, until, params)
        if model is not None:
            params["model"] = model
            where += " AND model = {model:String}"
        sql = f"""
            SELECT toStartOfInterval(t.end_timestamp, toIntervalSecond({{bucket:UInt32}}))
                       AS bucket,
                   t.model AS model, count() AS trajectories, avg(t.success) AS success_rate,
                   countIf(r.reward_version > 0) AS rewarded,
                   avgIf(r.reward, r.reward_version > 0) AS mean_reward
            FROM (SELECT tkey, model, end_timestamp, success
                  FROM {self.db}.trajectories FINAL WHERE {where}) AS t
            LEFT JOIN ({self._latest_rewards()}) AS r USING tkey
            GROUP BY bucket, model ORDER BY bucket, model"""
        rows = self._rows(sql, params)
        for row in rows:  # avgIf over nothing is nan: no reward yet
            if row["rewarded"] == 0:
                row["mean_reward"] = None
        return rows

    def length_histogram(
        self, model: str | None = None, domain: str | None = None
    ) -> list[dict[str, Any]]:
        """Trajectories per turn count."""
        params: dict[str, Any] = {}
        where = "1"
        if model is not None:
            params["model"] = model
            where += " AND model = {model:String}"
        if domain is not None:
            params["domain"] = domain
            where += " AND domain = {domain:String}"
        sql = f"""
            SELECT turn_count AS turns, count() AS trajectories
            FROM {self.db}.trajectories FINAL WHERE {where}
            GROUP BY turns ORDER BY turns"""
        return self._rows(sql, params)

    def tools(self, limit: int = 10, order: str = "slowest") -> list[dict[str, Any]]:
        """Per tool: calls, failures, failure rate, mean and p95 duration; the `limit`
        slowest (by p95) or most failing (by failures, then rate)."""
        order_by = {
            "slowest": "p95_ms DESC, mean_ms DESC, tool",
            "failing": "failures DESC, failure_rate DESC, tool",
        }[order]
        sql = f"""
            SELECT tool_name AS tool, count() AS calls, countIf(success = 0) AS failures,
                   avg(1 - success) AS failure_rate, avg(duration_ms) AS mean_ms,
                   quantileExact(0.95)(duration_ms) AS p95_ms
            FROM {self.db}.turns FINAL WHERE tool_name != ''
            GROUP BY tool ORDER BY {order_by} LIMIT {{limit:UInt32}}"""
        return self._rows(sql, {"limit": int(limit)})

    def feedback_counts(
        self, since: datetime | None = None, until: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Feedback events per type, with the mean rating of 'rating' feedback."""
        params: dict[str, Any] = {}
        where = _window("timestamp", since, until, params)
        sql = f"""
            SELECT type, count() AS count, countDistinct(trajectory_id) AS trajectories,
                   avgIf(rating, rating > 0) AS mean_rating
            FROM {self.db}.feedback FINAL WHERE {where}
            GROUP BY type ORDER BY type"""
        rows = self._rows(sql, params)
        for row in rows:
            if row["type"] != "rating":
                row["mean_rating"] = None
        return rows

    def training_timeline(self) -> list[dict[str, Any]]:
        """One row per training job: first and last event, last status, steps, checkpoint."""
        sql = f"""
            SELECT training_job_id, min(timestamp) AS first_event, max(timestamp) AS last_event,
                   argMax(status, (timestamp, current_step)) AS status, count() AS events,
                   max(current_step) AS steps,
                   argMax(final_checkpoint, length(final_checkpoint) > 0) AS final_checkpoint,
                   argMax(base_model, length(base_model) > 0) AS base_model,
                   argMax(error_code, length(error_code) > 0) AS error_code
            FROM {self.db}.training_jobs FINAL
            GROUP BY training_job_id ORDER BY first_event, training_job_id"""
        return self._rows(sql)

    def deployments_timeline(self) -> list[dict[str, Any]]:
        """Every deployment event in time order."""
        sql = f"""
            SELECT timestamp, deployment_id, training_job_id, model_id, base_model,
                   rollout_strategy, traffic_percentage, approval_status, previous_model,
                   benchmark_passed, safety_checks_passed
            FROM {self.db}.deployments FINAL ORDER BY timestamp, deployment_id"""
        return self._rows(sql)

    def model_versions(self) -> list[dict[str, Any]]:
        sql = f"""
            SELECT model_id, base_model, training_job_id, checkpoint_path, training_date,
                   training_samples, final_reward, traffic_percentage, previous_model, updated_at
            FROM {self.db}.model_versions FINAL ORDER BY updated_at, model_id"""
        return self._rows(sql)


QUERIES = (
    "rewards",
    "success",
    "lengths",
    "tools",
    "failing-tools",
    "feedback",
    "training",
    "deployments",
    "models",
    "counts",
)


def run_named(analytics: Analytics, name: str, **kw: Any) -> Any:
    """Run a query by its CLI/HTTP name with keyword options (None = default)."""
    kw = {k: v for k, v in kw.items() if v is not None}
    since, until = kw.get("since"), kw.get("until")
    if name == "rewards":
        return analytics.reward_distribution(since, until)
    if name == "success":
        return analytics.success_over_time(kw.get("bucket_s", 3600), kw.get("model"), since, until)
    if name == "lengths":
        return analytics.length_histogram(kw.get("model"), kw.get("domain"))
    if name == "tools":
        return analytics.tools(kw.get("limit", 10), "slowest")
    if name == "failing-tools":
        return analytics.tools(kw.get("limit", 10), "failing")
    if name == "feedback":
        return analytics.feedback_counts(since, until)
    if name == "training":
        return analytics.training_timeline()
    if name == "deployments":
        return analytics.deployments_timeline()
    if name == "models":
        return analytics.model_versions()
    if name == "counts":
        return analytics.counts()
    raise KeyError(f"unknown query {name!r}; one of {', '.join(QUERIES)}")
