-- What the pipeline needs beyond the design's tables: decision ordinals on the timeline, surfaced
-- projection errors, pg sequence gap tracking, and the effects worker's retry schedule.

-- A delivery's row keeps its latest outcome (parked, then unparked): seq is the resource's decision
-- ordinal, so a replayed older decision never overwrites a newer one.
ALTER TABLE webhook_events ADD COLUMN seq bigint NOT NULL DEFAULT 0;
ALTER TABLE webhook_events ADD COLUMN error text;

-- Errors that must be seen, not swallowed (e.g. an overpayment claim_id collision).
CREATE TABLE projection_errors (
  id          bigserial PRIMARY KEY,
  kind        text NOT NULL,
  key         text NOT NULL,
  detail      jsonb NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (kind, key, detail)
);

-- pg's sequence is global per merchant: the highest seen, and every gap with its first-seen time.
CREATE TABLE pg_sequence_state (
  merchant  text PRIMARY KEY,
  max_seen  bigint NOT NULL
);
CREATE TABLE pg_sequence_gaps (
  merchant              text NOT NULL,
  start_seq             bigint NOT NULL,
  end_seq               bigint NOT NULL CHECK (end_seq >= start_seq),
  first_seen_at         timestamptz NOT NULL,
  backfill_requested_at timestamptz,
  PRIMARY KEY (merchant, start_seq)
);

ALTER TABLE effects ADD COLUMN next_attempt_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE effects ADD COLUMN dead_at timestamptz;
DROP INDEX effects_undelivered;
CREATE INDEX effects_due ON effects (next_attempt_at) WHERE delivered_at IS NULL AND dead_at IS NULL;
