-- The card gateway's read models (DESIGN.md §5, gateway-docs/card-gateway-order-playbook.txt).
-- Totals are written whole from the reducer's output, never incremented.

CREATE TABLE card_payments (
  payment_ref      text PRIMARY KEY,
  state            text NOT NULL CHECK (state IN ('created','authorised','captured','refunded','voided')),
  authorised_minor bigint NOT NULL DEFAULT 0 CHECK (authorised_minor >= 0),
  captured_minor   bigint NOT NULL DEFAULT 0 CHECK (captured_minor >= 0),
  refunded_minor   bigint NOT NULL DEFAULT 0 CHECK (refunded_minor >= 0 AND refunded_minor <= captured_minor),
  currency         text,
  updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE card_events (
  gateway_event_id text PRIMARY KEY,
  payment_ref      text NOT NULL,
  event_type       text NOT NULL,
  sequence         bigint,
  occurred_at      timestamptz,
  received_at      timestamptz NOT NULL,
  payload          bytea NOT NULL,          -- the raw bytes, not a parsed object
  applied_at       timestamptz,             -- null while parked
  source           text NOT NULL DEFAULT 'webhook' CHECK (source IN ('webhook','fetch'))
);
CREATE INDEX ON card_events (payment_ref);
CREATE INDEX card_events_parked ON card_events (received_at) WHERE applied_at IS NULL;
