-- A user's correction (free text: what the agent should have done) stored with the reward
-- version that carries it (metadata.feedback.correction); '' when there is none. Jobs read
-- it as the hint of the trajectory's task.
ALTER TABLE ${db}.rewards ADD COLUMN IF NOT EXISTS correction String DEFAULT ''
