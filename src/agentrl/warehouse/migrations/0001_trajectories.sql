-- One row per trajectory. A redelivered event has the same sorting key and partition, so
-- ReplacingMergeTree collapses it; queries read with FINAL (exact before merges).
CREATE TABLE IF NOT EXISTS ${db}.trajectories
(
    trajectory_id String,
    session_id String,
    agent_id LowCardinality(String),
    subordinate_profile LowCardinality(String),
    parent_trajectory_id String,
    task_id String,
    domain LowCardinality(String),
    model LowCardinality(String),
    start_timestamp DateTime64(3, 'UTC'),
    end_timestamp DateTime64(3, 'UTC'),
    duration_ms Float64,
    turn_count UInt32,
    tool_calls UInt32,
    failed_turns UInt32,
    total_tokens UInt64,
    total_cost_usd Float64,
    temperature Float64,
    task_status LowCardinality(String),
    success UInt8,
    completion_percentage Float64,
    raw_json String CODEC(ZSTD(3)),
    ingested_at DateTime64(3, 'UTC'),
    -- 64-bit join key: joins and GROUP BY on UInt64 instead of strings (several times faster)
    tkey UInt64 MATERIALIZED cityHash64(trajectory_id)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(end_timestamp)
ORDER BY (domain, model, trajectory_id)
TTL toDateTime(end_timestamp) + toIntervalSecond(${hot_ttl_s}) ${archive_action},
    toDateTime(end_timestamp) + toIntervalSecond(${delete_ttl_s}) DELETE
-- an acked event is on disk: the insert returns after its part was fsynced
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1
