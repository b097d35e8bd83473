-- When a delivery's decision first reached the read model: with received_at (set by the ingest)
-- it is the delivery's ingest-to-read-model latency, which bench/latency.py reports as p50/p99.
-- clock_timestamp(), not now(): rows of one batch transaction get the time of their own insert.
ALTER TABLE webhook_events ADD COLUMN projected_at timestamptz NOT NULL DEFAULT clock_timestamp();
