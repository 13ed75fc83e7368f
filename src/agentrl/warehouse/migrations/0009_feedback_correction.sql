-- The correction a feedback event carried beside its thumbs or rating ('' when none);
-- redacted like the comment before it is published.
ALTER TABLE ${db}.feedback ADD COLUMN IF NOT EXISTS correction String DEFAULT ''
