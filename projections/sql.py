"""The projector's SQL: every write repeats the guard, so applying a decision twice changes nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from projections.bulk import Bulk, unnest_insert

WEBHOOK_EVENTS = unnest_insert("webhook_events", """
    delivery_id text, gateway text, event_id text, resource_id text, event_type text, received_at timestamptz,
    outcome text, payload text::jsonb, seq bigint, error text""", """
ON CONFLICT (delivery_id) DO UPDATE
  SET outcome = EXCLUDED.outcome, seq = EXCLUDED.seq, error = EXCLUDED.error
  WHERE webhook_events.seq < EXCLUDED.seq
    -- the same delivery decided again (a re-append, a batch decided twice) is never "duplicate" of itself
    AND NOT (EXCLUDED.outcome = 'duplicate' AND webhook_events.outcome <> 'duplicate')""", key="delivery_id")

CORRELATIONS = unnest_insert("pg_deposit_correlations", """
    pg_deposit_id text, merchant_reference text, our_order_id text, our_user_id text""", "ON CONFLICT DO NOTHING")

_DEPOSIT = unnest_insert("pg_deposits", """
    pg_deposit_id text, pg_version bigint, status text, is_terminal boolean, late_slip_accepted_until text::timestamptz,
    ordered_amount_minor bigint, transferred_amount_minor bigint, amount_received_minor bigint, fee_total_minor bigint,
    credited_amount_minor bigint, fee_breakdown text::jsonb, overpayment text::jsonb, balance_transaction_id text,
    clearing_available_at text::timestamptz, our_order_id text, our_user_id text, credited_user_at text::timestamptz,
    reversed_at text::timestamptz""", """
ON CONFLICT (pg_deposit_id) DO UPDATE
  SET pg_version = EXCLUDED.pg_version, status = EXCLUDED.status, is_terminal = EXCLUDED.is_terminal,
      late_slip_accepted_until = EXCLUDED.late_slip_accepted_until,
      ordered_amount_minor = EXCLUDED.ordered_amount_minor,
      transferred_amount_minor = EXCLUDED.transferred_amount_minor,
      amount_received_minor = EXCLUDED.amount_received_minor, fee_total_minor = EXCLUDED.fee_total_minor,
      credited_amount_minor = EXCLUDED.credited_amount_minor, fee_breakdown = EXCLUDED.fee_breakdown,
      overpayment = EXCLUDED.overpayment, balance_transaction_id = EXCLUDED.balance_transaction_id,
      clearing_available_at = EXCLUDED.clearing_available_at,
      credited_user_at = COALESCE(pg_deposits.credited_user_at, EXCLUDED.credited_user_at),
      reversed_at = COALESCE(pg_deposits.reversed_at, EXCLUDED.reversed_at),
      updated_at = now()
  WHERE pg_deposits.pg_version < EXCLUDED.pg_version""", key="pg_deposit_id")

_WITHDRAWAL = unnest_insert("pg_withdrawals", """
    pg_withdrawal_id text, pg_version bigint, status text, amount_total_minor bigint, filled_minor bigint,
    remaining_minor bigint, fee_total_minor bigint, fee_recognized_minor bigint, refunded_minor bigint,
    settled_splits smallint, our_payout_id text, closed_at text::timestamptz""", """
ON CONFLICT (pg_withdrawal_id) DO UPDATE
  SET pg_version = EXCLUDED.pg_version, status = EXCLUDED.status,
      filled_minor = EXCLUDED.filled_minor,           -- overwrite from the guarded payload, never +=
      remaining_minor = EXCLUDED.remaining_minor, fee_total_minor = EXCLUDED.fee_total_minor,
      fee_recognized_minor = EXCLUDED.fee_recognized_minor, refunded_minor = EXCLUDED.refunded_minor,
      settled_splits = EXCLUDED.settled_splits,
      closed_at = COALESCE(pg_withdrawals.closed_at, EXCLUDED.closed_at), updated_at = now()
  WHERE pg_withdrawals.pg_version < EXCLUDED.pg_version""", key="pg_withdrawal_id")

_BALANCE_TXN = unnest_insert("pg_balance_txns", """
    btxn_id text, type text, direction text, amount_minor bigint, bucket_from text, bucket_to text, source_id text,
    created_at text::timestamptz""", "ON CONFLICT (btxn_id) DO NOTHING")

_CARD_PAYMENT = unnest_insert("card_payments", """
    payment_ref text, state text, authorised_minor bigint, captured_minor bigint, refunded_minor bigint,
    currency text, version bigint""", """
ON CONFLICT (payment_ref) DO UPDATE
  SET state = EXCLUDED.state, authorised_minor = EXCLUDED.authorised_minor,
      captured_minor = EXCLUDED.captured_minor,      -- written whole from the reducer, never +=
      refunded_minor = EXCLUDED.refunded_minor, currency = EXCLUDED.currency, version = EXCLUDED.version,
      updated_at = now()
  WHERE card_payments.version < EXCLUDED.version""", key="payment_ref")


_STRIPE_PAYMENT_INTENT = unnest_insert("stripe_payment_intents", """
    id text, status text, amount_minor bigint, amount_received_minor bigint, amount_refunded_minor bigint,
    currency text, dispute_status text, updated_at text::timestamptz, version bigint""", """
ON CONFLICT (id) DO UPDATE
  SET status = EXCLUDED.status, amount_minor = EXCLUDED.amount_minor,
      amount_received_minor = EXCLUDED.amount_received_minor,  -- written whole from the reducer, never +=
      amount_refunded_minor = EXCLUDED.amount_refunded_minor, currency = EXCLUDED.currency,
      dispute_status = EXCLUDED.dispute_status, updated_at = EXCLUDED.updated_at, version = EXCLUDED.version
  WHERE stripe_payment_intents.version < EXCLUDED.version""", key="id")


def _paymos(table: str) -> Bulk:
    return unnest_insert(table, """
    id text, status text, is_final boolean, updated_at_ms bigint, snapshot text::jsonb, applied_seq bigint""", f"""
ON CONFLICT (id) DO UPDATE
  SET status = EXCLUDED.status, is_final = EXCLUDED.is_final, updated_at_ms = EXCLUDED.updated_at_ms,
      snapshot = EXCLUDED.snapshot, applied_seq = EXCLUDED.applied_seq
  WHERE {table}.applied_seq < EXCLUDED.applied_seq""", key="id")


PAYMOS_TABLES = ("paymos_invoices", "paymos_withdrawals", "paymos_channel_deposits")
UPSERT_ROW = {"pg_deposits": _DEPOSIT, "pg_withdrawals": _WITHDRAWAL, "pg_balance_txns": _BALANCE_TXN,
              "card_payments": _CARD_PAYMENT, **{t: _paymos(t) for t in PAYMOS_TABLES},
              "stripe_payment_intents": _STRIPE_PAYMENT_INTENT}
# adyen (docs/gateways/adyen.md): guarded by the count of the payment's stored items, as card_payments
UPSERT_ROW["adyen_payments"] = unnest_insert("adyen_payments", """
    psp_reference text, merchant_reference text, state text, authorised_minor bigint, captured_minor bigint,
    refunded_minor bigint, currency text, updated_at text::timestamptz, version bigint""", """
ON CONFLICT (psp_reference) DO UPDATE
  SET merchant_reference = EXCLUDED.merchant_reference, state = EXCLUDED.state,
      authorised_minor = EXCLUDED.authorised_minor, captured_minor = EXCLUDED.captured_minor,
      refunded_minor = EXCLUDED.refunded_minor, currency = EXCLUDED.currency, updated_at = EXCLUDED.updated_at,
      version = EXCLUDED.version
  WHERE adyen_payments.version < EXCLUDED.version""", key="psp_reference")
_JSON = {"fee_breakdown", "overpayment", "snapshot"}


def row_args(table: str, row: Mapping[str, Any]) -> list[Any]:
    return [orjson.dumps(row[c]).decode() if c in _JSON and row[c] is not None else row[c]
            for c in UPSERT_ROW[table].columns]


FILLS = unnest_insert("pg_withdrawal_fills", """
    leg_ref text, pg_withdrawal_id text, sequence smallint, amount_minor bigint, fee_recognized_minor bigint,
    settled_at text::timestamptz, auto_confirm_at text::timestamptz, balance_transaction_id text""",
    "ON CONFLICT (leg_ref) DO NOTHING")

INSERT_FLAG = """
INSERT INTO pg_deposit_overpayment_flags (claim_id, pg_deposit_id, observed_deposit_version, cause, amount_minor,
                                          slip_received_at, status_snapshot, action_required_snapshot,
                                          expected_response_at, raw_flag)
VALUES ($1, $2, $3, $4, $5, $6::text::timestamptz, $7, $8, $9::text::timestamptz, $10::jsonb)
ON CONFLICT (claim_id) DO NOTHING
RETURNING claim_id"""

SAME_FLAG = """
SELECT 1 FROM pg_deposit_overpayment_flags
 WHERE claim_id = $1 AND pg_deposit_id = $2 AND cause = $3 AND amount_minor = $4
   AND slip_received_at = $5::text::timestamptz AND status_snapshot = $6 AND action_required_snapshot = $7
   AND expected_response_at IS NOT DISTINCT FROM $8::text::timestamptz AND raw_flag = $9::jsonb"""

LEDGER = unnest_insert("ledger_entries", "entry_key text, user_id text, amount_minor bigint, source_id text",
                       "ON CONFLICT (entry_key) DO NOTHING")

INSERT_ERROR = """
INSERT INTO projection_errors (kind, key, detail) VALUES ($1, $2, $3::jsonb) ON CONFLICT DO NOTHING"""

SELECT_OFFSETS = "SELECT partition, next_offset FROM projector_offsets WHERE consumer = $1 AND topic = $2"
LOCK_OFFSETS = """
SELECT partition, next_offset FROM projector_offsets
 WHERE consumer = $1 AND topic = $2 AND partition = ANY($3::integer[])
 ORDER BY partition FOR UPDATE"""  # one lock order for every instance: two overlapping ones cannot deadlock
UPSERT_OFFSETS = """
INSERT INTO projector_offsets (consumer, topic, partition, next_offset)
SELECT $1, $2, partition, next_offset FROM unnest($3::integer[], $4::bigint[]) AS t(partition, next_offset)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset"""

# A gateway's event sequence (pg's: one per merchant, the gateway's name in ``merchant``): an
# advisory lock serialises every projector instance on it.
LOCK_SEQUENCES = "SELECT pg_advisory_xact_lock(73556081)"
SELECT_SEQUENCE_MAX = "SELECT max_seen FROM pg_sequence_state WHERE merchant = $1"
UPSERT_SEQUENCE_MAX = """
INSERT INTO pg_sequence_state (merchant, max_seen) VALUES ($1, $2)
ON CONFLICT (merchant) DO UPDATE SET max_seen = EXCLUDED.max_seen"""
# The gaps that hold any of the numbers $2 (one index probe per number, not every open gap: a broken
# sequence can leave a gap per event open, and a batch must not read them all).
SELECT_GAPS_HOLDING = """
SELECT DISTINCT g.start_seq, g.end_seq, g.first_seen_at, g.backfill_requested_at
  FROM unnest($2::bigint[]) AS s(seq)
 CROSS JOIN LATERAL (SELECT start_seq, end_seq, first_seen_at, backfill_requested_at FROM pg_sequence_gaps
                      WHERE merchant = $1 AND start_seq <= s.seq ORDER BY start_seq DESC LIMIT 1) AS g
 WHERE g.end_seq >= s.seq
 ORDER BY g.start_seq"""
# Those open since $2 or longer whose backfill was not requested yet, starting after $3 and up to $4
# (NULL: no end), the lowest first, at most $5.
SELECT_GAPS_DUE = """
SELECT start_seq, end_seq, first_seen_at, backfill_requested_at FROM pg_sequence_gaps
 WHERE merchant = $1 AND backfill_requested_at IS NULL AND first_seen_at <= $2
   AND start_seq > $3 AND ($4::bigint IS NULL OR start_seq <= $4)
 ORDER BY start_seq LIMIT $5"""
GAPS_OPEN = """
SELECT count(*) AS gaps, coalesce(sum(end_seq - start_seq + 1), 0)::bigint AS missing FROM pg_sequence_gaps
 WHERE merchant = ANY($1::text[])"""
DELETE_GAPS = "DELETE FROM pg_sequence_gaps WHERE merchant = $1 AND start_seq = ANY($2::bigint[])"
GAPS = unnest_insert("pg_sequence_gaps", """
    merchant text, start_seq bigint, end_seq bigint, first_seen_at timestamptz,
    backfill_requested_at timestamptz""", "")
MARK_BACKFILLS_REQUESTED = """
UPDATE pg_sequence_gaps SET backfill_requested_at = now() WHERE merchant = $1 AND start_seq = ANY($2::bigint[])"""
# Every gap within the range $2..$3 of a backfill that was not done: a late number may have cut the
# requested gap into pieces meanwhile (run under LOCK_SEQUENCES, after the projector's writes).
UNMARK_BACKFILLS_REQUESTED = """
UPDATE pg_sequence_gaps SET backfill_requested_at = NULL
 WHERE merchant = $1 AND start_seq >= $2 AND start_seq <= $3"""

CARD_EVENTS = unnest_insert("card_events", """
    gateway_event_id text, payment_ref text, event_type text, sequence bigint, occurred_at text::timestamptz,
    received_at text::timestamptz, payload bytea, source text""", "ON CONFLICT (gateway_event_id) DO NOTHING")
MARK_CARD_EVENT_APPLIED = """
UPDATE card_events SET applied_at = $2::text::timestamptz WHERE gateway_event_id = $1 AND applied_at IS NULL"""

NOTES = unnest_insert("order_notes", "note_key text, resource_id text, kind text, body text",
                      "ON CONFLICT (note_key) DO NOTHING")
