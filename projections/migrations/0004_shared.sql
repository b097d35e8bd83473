-- Read models shared by every gateway (DESIGN.md §5) and the projector's consumer positions.

-- One row per delivery with its outcome. delivery_id (assigned at ingest) is the key: the same
-- gateway event delivered twice is two rows, the second with outcome 'duplicate'.
CREATE TABLE webhook_events (
  delivery_id text PRIMARY KEY,
  gateway     text NOT NULL,
  event_id    text,
  resource_id text,
  event_type  text,
  received_at timestamptz NOT NULL,
  outcome     text NOT NULL CHECK (outcome IN
                ('applied','stale','duplicate','parked','unparked','quarantined','synced')),
  payload     jsonb
);
CREATE INDEX ON webhook_events (gateway, resource_id, received_at);
CREATE INDEX ON webhook_events (gateway, event_id);

CREATE TABLE effects (
  dedupe_key   text PRIMARY KEY,
  type         text NOT NULL,
  gateway      text NOT NULL,
  resource_id  text NOT NULL,
  payload      jsonb NOT NULL,
  caused_by    text NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now(),
  delivered_at timestamptz,
  attempts     integer NOT NULL DEFAULT 0,
  last_error   text
);
CREATE INDEX effects_undelivered ON effects (created_at) WHERE delivered_at IS NULL;

CREATE TABLE ledger_entries (
  entry_key    text PRIMARY KEY,             -- the effect's dedupe key: a credit lands once
  user_id      text NOT NULL,
  amount_minor bigint NOT NULL CHECK (amount_minor <> 0),
  source_id    text NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON ledger_entries (user_id);

CREATE VIEW user_balances AS
  SELECT user_id, sum(amount_minor)::bigint AS balance_minor, count(*) AS entries
    FROM ledger_entries GROUP BY user_id;

-- Consumed offsets, written in the same transaction as the rows they produced, so a record that is
-- delivered again after a crash changes nothing.
CREATE TABLE projector_offsets (
  consumer    text NOT NULL,
  topic       text NOT NULL,
  partition   integer NOT NULL,
  next_offset bigint NOT NULL,
  PRIMARY KEY (consumer, topic, partition)
);
