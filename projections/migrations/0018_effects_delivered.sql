-- The console's and GET /api/effects' delivered effects, newest first (app/admin/queries.py EFFECTS):
-- they only accumulate, and without this index each visit read and sorted all of them (0.5 s at three
-- million). One more index entry per delivered effect. Building it reads effects once (0.8 s at three
-- million); it holds writes, not reads, meanwhile.
CREATE INDEX effects_delivered ON effects (created_at DESC, dedupe_key) WHERE delivered_at IS NOT NULL;
