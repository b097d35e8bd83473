-- The pg gateway's read models, exactly as in gateway-docs/pg-event-order-version-guard.txt.
-- (pg_webhook_inbox is replaced by orderly.raw + webhook_events, see DESIGN.md §5.)

CREATE TABLE pg_deposit_correlations (
  pg_deposit_id       text PRIMARY KEY,
  merchant_reference text NOT NULL UNIQUE,
  our_order_id        text NOT NULL,
  our_user_id         text NOT NULL
);
CREATE INDEX ON pg_deposit_correlations (our_order_id);

CREATE TABLE pg_deposits (
  pg_deposit_id          text PRIMARY KEY,
  pg_version             bigint NOT NULL,
  status                 text   NOT NULL,
  is_terminal            boolean,
  late_slip_accepted_until timestamptz,
  ordered_amount_minor   bigint,
  transferred_amount_minor bigint,
  amount_received_minor  bigint,
  fee_total_minor        bigint,
  credited_amount_minor  bigint,
  fee_breakdown          jsonb,
  overpayment            jsonb,
  balance_transaction_id text,
  clearing_available_at  timestamptz,
  our_order_id           text NOT NULL,
  our_user_id            text NOT NULL,
  credited_user_at       timestamptz,
  reversed_at            timestamptz,
  updated_at             timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT pg_deposit_money_ck
    CHECK (status NOT IN ('settled','reversed')
           OR (ordered_amount_minor IS NOT NULL
               AND transferred_amount_minor IS NOT NULL
               AND amount_received_minor IS NOT NULL
               AND fee_total_minor IS NOT NULL
               AND credited_amount_minor IS NOT NULL
               AND ordered_amount_minor > 0
               AND transferred_amount_minor > 0
               AND amount_received_minor > 0
               AND amount_received_minor = LEAST(transferred_amount_minor,ordered_amount_minor)
               AND fee_total_minor BETWEEN 0 AND amount_received_minor
               AND amount_received_minor - fee_total_minor = credited_amount_minor))
);
CREATE INDEX ON pg_deposits (our_order_id);

CREATE TABLE pg_deposit_overpayment_flags (
  claim_id                text PRIMARY KEY,
  pg_deposit_id           text NOT NULL REFERENCES pg_deposits(pg_deposit_id),
  observed_deposit_version bigint NOT NULL,
  cause                   text NOT NULL CHECK (cause IN ('same_transfer_excess','additional_transfer')),
  amount_minor            bigint NOT NULL CHECK (amount_minor > 0),
  slip_received_at        timestamptz NOT NULL,
  status_snapshot         text NOT NULL CHECK (status_snapshot = 'open'),
  action_required_snapshot text NOT NULL CHECK (action_required_snapshot = 'contact_support'),
  expected_response_at    timestamptz,
  raw_flag                jsonb NOT NULL,
  received_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON pg_deposit_overpayment_flags (pg_deposit_id, observed_deposit_version);
CREATE FUNCTION pg_reject_overpayment_flag_mutation() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN
  RAISE EXCEPTION 'pg_deposit_overpayment_flags is append-only' USING ERRCODE = '55000';
  RETURN OLD; -- unreachable; makes the trigger return contract explicit
END $$;
CREATE TRIGGER pg_deposit_overpayment_flags_immutable
  BEFORE UPDATE OR DELETE ON pg_deposit_overpayment_flags
  FOR EACH ROW EXECUTE FUNCTION pg_reject_overpayment_flag_mutation();

CREATE TABLE pg_withdrawals (
  pg_withdrawal_id     text PRIMARY KEY,
  pg_version           bigint NOT NULL,
  status               text   NOT NULL,
  amount_total_minor   bigint NOT NULL,
  filled_minor         bigint NOT NULL DEFAULT 0,
  remaining_minor      bigint NOT NULL,
  fee_total_minor      bigint,
  fee_recognized_minor bigint,
  refunded_minor       bigint,
  settled_splits       smallint,
  our_payout_id        text NOT NULL,
  closed_at            timestamptz,
  updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pg_withdrawal_fills (
  leg_ref              text PRIMARY KEY,
  pg_withdrawal_id     text NOT NULL REFERENCES pg_withdrawals(pg_withdrawal_id),
  sequence             smallint,
  amount_minor         bigint NOT NULL,
  fee_recognized_minor bigint,
  settled_at           timestamptz,
  auto_confirm_at      timestamptz,
  balance_transaction_id text,
  reversed_at          timestamptz,
  received_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON pg_withdrawal_fills (pg_withdrawal_id, sequence);

CREATE TABLE pg_balance_txns (
  btxn_id      text PRIMARY KEY,
  type         text NOT NULL,
  direction    text NOT NULL,
  amount_minor bigint NOT NULL,
  bucket_from  text,
  bucket_to    text,
  source_id    text,
  created_at   timestamptz NOT NULL
);
CREATE INDEX ON pg_balance_txns (source_id);
