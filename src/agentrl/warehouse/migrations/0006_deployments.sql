-- Every agent.rl.model.deployed.v1 event. No TTL: the rollout history is small.
CREATE TABLE IF NOT EXISTS ${db}.deployments
(
    deployment_id String,
    training_job_id String,
    timestamp DateTime64(3, 'UTC'),
    model_id LowCardinality(String),
    base_model LowCardinality(String),
    checkpoint_path String,
    rollout_strategy LowCardinality(String),
    traffic_percentage Float64,
    benchmark_passed UInt8,
    safety_checks_passed UInt8,
    performance_regression UInt8,
    approval_status LowCardinality(String),
    previous_model LowCardinality(String),
    raw_json String CODEC(ZSTD(3)),
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(timestamp)
ORDER BY (deployment_id, timestamp)
-- an acked event is on disk: the insert returns after its part was fsynced
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1
