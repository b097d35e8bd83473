-- card_payments rows are guarded like pg's: a row written for an older reducer run (fewer stored
-- events) never overwrites a newer one.
ALTER TABLE card_payments ADD COLUMN version bigint NOT NULL DEFAULT 0;
