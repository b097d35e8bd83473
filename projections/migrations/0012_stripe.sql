-- The stripe gateway's read model (DESIGN.md §2.5, §5; docs/gateways/stripe.md). One row per
-- PaymentIntent (or PaymentIntent-less charge), written whole from the reducer's latest snapshots,
-- never incremented; `version` (the resource's stored events, which only accumulate) guards it.
-- Statuses as Stripe sends them (no CHECK: a status Stripe adds must not set rows aside); a
-- PaymentIntent stays 'succeeded' after refunds.

CREATE TABLE stripe_payment_intents (
  id                    text PRIMARY KEY,
  status                text,                   -- NULL until the PaymentIntent's own snapshot arrives
  amount_minor          bigint CHECK (amount_minor >= 0),
  amount_received_minor bigint NOT NULL DEFAULT 0 CHECK (amount_received_minor >= 0),
  amount_refunded_minor bigint NOT NULL DEFAULT 0 CHECK (amount_refunded_minor >= 0),
  currency              text,                   -- lower-case, as Stripe sends it
  dispute_status        text,
  updated_at            timestamptz,            -- the newest `created` among the applied snapshots
  version               bigint NOT NULL DEFAULT 0
);
