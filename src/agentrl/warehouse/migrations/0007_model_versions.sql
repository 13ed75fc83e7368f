-- One row per model version (the seed's "model versioning"), from deployment events: the
-- newest event of a model id wins (ReplacingMergeTree on updated_at). Kept indefinitely.
CREATE TABLE IF NOT EXISTS ${db}.model_versions
(
    model_id String,
    base_model LowCardinality(String),
    training_job_id String,
    checkpoint_path String,
    training_date DateTime64(3, 'UTC'),
    training_samples UInt64,
    final_reward Float64,
    last_deployment_id String,
    traffic_percentage Float64,
    previous_model String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY model_id
-- an acked event is on disk: the insert returns after its part was fsynced
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1
