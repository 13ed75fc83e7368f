-- One row per turn; keyed by (trajectory, turn) so a redelivered trajectory collapses.
CREATE TABLE IF NOT EXISTS ${db}.turns
(
    trajectory_id String,
    turn_id UInt32,
    timestamp DateTime64(3, 'UTC'),
    domain LowCardinality(String),
    model LowCardinality(String),
    action_type LowCardinality(String),
    tool_name LowCardinality(String),
    args_size UInt32,
    success UInt8,
    has_result UInt8,
    error String,
    duration_ms Float64,
    tokens UInt32
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(timestamp)
ORDER BY (tool_name, trajectory_id, turn_id)
TTL toDateTime(timestamp) + toIntervalSecond(${hot_ttl_s}) ${archive_action},
    toDateTime(timestamp) + toIntervalSecond(${delete_ttl_s}) DELETE
-- an acked event is on disk: the insert returns after its part was fsynced
SETTINGS fsync_after_insert = 1, fsync_part_directory = 1
