-- One row per reward version of a trajectory (late feedback yields version + 1); the
-- latest version wins in queries (argMax over version). Components as parallel arrays.
CREATE TABLE IF NOT EXISTS ${db}.rewards
(
    reward_id String,
    trajectory_id String,
    session_id String,
    timestamp DateTime64(3, 'UTC'),
    version UInt32,
    model LowCardinality(String),
    total_reward Float64,
    raw_total_reward Float64,
    normalized_total_reward Float64,
    total_reward_kind LowCardinality(String),
    reward_type LowCardinality(String),
    calculator_version LowCardinality(String),
    component_names Array(LowCardinality(String)),
    component_scores Array(Float64),
    component_weights Array(Float64),
    component_sources Array(LowCardinality(String)),
    normalization_method LowCardinality(String),
    normalization_mean Float64,
    normalization_std Float64,
    evaluator LowCardinality(String),
    confidence Float64,
    ingested_at DateTime64(3, 'UTC'),
    -- 64-bit join key: joins and GROUP BY on UInt64 instead of strings (several times faster)
    tkey UInt64 MATERIALIZED cityHash64(trajectory_id)
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(timestamp)
ORDER BY (trajectory_id, version)
TTL toDateTime(timestamp) + toIntervalSecond(${hot_ttl_s}) ${archive_action},
    toDateTime(timestamp) + toIntervalSecond(${delete_ttl_s}) DELETE
-- an acked event is on disk: the insert returns after its part was fsynced
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1
