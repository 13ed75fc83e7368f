-- Per-turn rewards of a reward version (metadata.turn_rewards: each turn's partial credit,
-- the outcome on the last; they sum to the total), [] when the reward has none. Jobs that
-- read the warehouse give them to GiGPO's step groups (Record.turn_rewards).
ALTER TABLE ${db}.rewards ADD COLUMN IF NOT EXISTS turn_rewards Array(Float64) DEFAULT []
