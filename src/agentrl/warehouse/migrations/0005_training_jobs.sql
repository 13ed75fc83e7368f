-- Every training status event (queued, running..., completed/failed/cancelled). Status
-- events have no id: event_id is their content hash (the bus's Nats-Msg-Id). Kept without
-- TTL: a job history is small and the model lineage needs it.
CREATE TABLE IF NOT EXISTS ${db}.training_jobs
(
    training_job_id String,
    timestamp DateTime64(3, 'UTC'),
    event_id String,
    status LowCardinality(String),
    current_epoch UInt32,
    current_step UInt64,
    total_steps UInt64,
    percent_complete Float64,
    loss Float64,
    reward_mean Float64,
    final_checkpoint String,
    base_model LowCardinality(String),
    error_code LowCardinality(String),
    error_message String,
    raw_json String CODEC(ZSTD(3)),
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(timestamp)
ORDER BY (training_job_id, timestamp, event_id)
-- an acked event is on disk: the insert returns after its part was fsynced
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1
