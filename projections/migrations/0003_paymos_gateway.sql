-- The paymos gateway's read models (DESIGN.md §5). Crypto amounts stay decimal strings in the
-- snapshot and NUMERIC in columns, never floats.

CREATE TABLE paymos_invoices (
  id            text PRIMARY KEY,
  status        text NOT NULL,
  is_final      boolean NOT NULL,
  updated_at_ms bigint NOT NULL,
  snapshot      jsonb NOT NULL
);

CREATE TABLE paymos_withdrawals (
  id            text PRIMARY KEY,
  status        text NOT NULL,
  is_final      boolean NOT NULL,
  updated_at_ms bigint NOT NULL,
  snapshot      jsonb NOT NULL
);

CREATE TABLE paymos_channel_deposits (
  id            text PRIMARY KEY,
  status        text NOT NULL,
  is_final      boolean NOT NULL,
  updated_at_ms bigint NOT NULL,
  snapshot      jsonb NOT NULL
);

CREATE TABLE order_notes (
  note_key    text PRIMARY KEY,
  resource_id text NOT NULL,
  kind        text NOT NULL,
  body        text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON order_notes (resource_id);
