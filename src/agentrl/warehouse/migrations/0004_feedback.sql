-- One row per feedback event (agent.rl.feedback.v1).
CREATE TABLE IF NOT EXISTS ${db}.feedback
(
    feedback_id String,
    trajectory_id String,
    session_id String,
    user_id String,
    timestamp DateTime64(3, 'UTC'),
    type LowCardinality(String),
    rating UInt8,
    comment String,
    ingested_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(timestamp)
ORDER BY (type, trajectory_id, feedback_id)
TTL toDateTime(timestamp) + toIntervalSecond(${hot_ttl_s}) ${archive_action},
    toDateTime(timestamp) + toIntervalSecond(${delete_ttl_s}) DELETE
-- an acked event is on disk: the insert returns after its part was fsynced
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1
