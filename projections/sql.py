"""The projector's SQL: every write repeats the guard, so applying a decision twice changes nothing."""

from __future__ import annotations

from typing import Any

import orjson

UPSERT_WEBHOOK_EVENT = """
INSERT INTO webhook_events (delivery_id, gateway, event_id, resource_id, event_type, received_at, outcome,
                            payload, seq, error)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10)
ON CONFLICT (delivery_id) DO UPDATE
  SET outcome = EXCLUDED.outcome, seq = EXCLUDED.seq, error = EXCLUDED.error
  WHERE webhook_events.seq < EXCLUDED.seq
    -- the same delivery decided again (a re-append, a batch decided twice) is never "duplicate" of itself
    AND NOT (EXCLUDED.outcome = 'duplicate' AND webhook_events.outcome <> 'duplicate')"""

INSERT_CORRELATION = """
INSERT INTO pg_deposit_correlations (pg_deposit_id, merchant_reference, our_order_id, our_user_id)
VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"""

_DEPOSIT = """
INSERT INTO pg_deposits (pg_deposit_id, pg_version, status, is_terminal, late_slip_accepted_until,
                         ordered_amount_minor, transferred_amount_minor, amount_received_minor, fee_total_minor,
                         credited_amount_minor, fee_breakdown, overpayment, balance_transaction_id,
                         clearing_available_at, our_order_id, our_user_id, credited_user_at, reversed_at)
VALUES ($1, $2, $3, $4, $5::text::timestamptz, $6, $7, $8, $9, $10, $11::jsonb, $12::jsonb, $13,
        $14::text::timestamptz, $15, $16, $17::text::timestamptz, $18::text::timestamptz)
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
  WHERE pg_deposits.pg_version < EXCLUDED.pg_version"""

_WITHDRAWAL = """
INSERT INTO pg_withdrawals (pg_withdrawal_id, pg_version, status, amount_total_minor, filled_minor,
                            remaining_minor, fee_total_minor, fee_recognized_minor, refunded_minor, settled_splits,
                            our_payout_id, closed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::text::timestamptz)
ON CONFLICT (pg_withdrawal_id) DO UPDATE
  SET pg_version = EXCLUDED.pg_version, status = EXCLUDED.status,
      filled_minor = EXCLUDED.filled_minor,           -- overwrite from the guarded payload, never +=
      remaining_minor = EXCLUDED.remaining_minor, fee_total_minor = EXCLUDED.fee_total_minor,
      fee_recognized_minor = EXCLUDED.fee_recognized_minor, refunded_minor = EXCLUDED.refunded_minor,
      settled_splits = EXCLUDED.settled_splits,
      closed_at = COALESCE(pg_withdrawals.closed_at, EXCLUDED.closed_at), updated_at = now()
  WHERE pg_withdrawals.pg_version < EXCLUDED.pg_version"""

_BALANCE_TXN = """
INSERT INTO pg_balance_txns (btxn_id, type, direction, amount_minor, bucket_from, bucket_to, source_id, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::timestamptz)
ON CONFLICT (btxn_id) DO NOTHING"""

_CARD_PAYMENT = """
INSERT INTO card_payments (payment_ref, state, authorised_minor, captured_minor, refunded_minor, currency, version)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (payment_ref) DO UPDATE
  SET state = EXCLUDED.state, authorised_minor = EXCLUDED.authorised_minor,
      captured_minor = EXCLUDED.captured_minor,      -- written whole from the reducer, never +=
      refunded_minor = EXCLUDED.refunded_minor, currency = EXCLUDED.currency, version = EXCLUDED.version,
      updated_at = now()
  WHERE card_payments.version < EXCLUDED.version"""

def _paymos(table: str) -> str:
    return f"""
INSERT INTO {table} (id, status, is_final, updated_at_ms, snapshot, applied_seq)
VALUES ($1, $2, $3, $4, $5::jsonb, $6)
ON CONFLICT (id) DO UPDATE
  SET status = EXCLUDED.status, is_final = EXCLUDED.is_final, updated_at_ms = EXCLUDED.updated_at_ms,
      snapshot = EXCLUDED.snapshot, applied_seq = EXCLUDED.applied_seq
  WHERE {table}.applied_seq < EXCLUDED.applied_seq"""


PAYMOS_TABLES = ("paymos_invoices", "paymos_withdrawals", "paymos_channel_deposits")
UPSERT_ROW = {"pg_deposits": _DEPOSIT, "pg_withdrawals": _WITHDRAWAL, "pg_balance_txns": _BALANCE_TXN,
              "card_payments": _CARD_PAYMENT, **{t: _paymos(t) for t in PAYMOS_TABLES}}

_COLUMNS = {
    "pg_deposits": ("pg_deposit_id", "pg_version", "status", "is_terminal", "late_slip_accepted_until",
                    "ordered_amount_minor", "transferred_amount_minor", "amount_received_minor", "fee_total_minor",
                    "credited_amount_minor", "fee_breakdown", "overpayment", "balance_transaction_id",
                    "clearing_available_at", "our_order_id", "our_user_id", "credited_user_at", "reversed_at"),
    "pg_withdrawals": ("pg_withdrawal_id", "pg_version", "status", "amount_total_minor", "filled_minor",
                       "remaining_minor", "fee_total_minor", "fee_recognized_minor", "refunded_minor",
                       "settled_splits", "our_payout_id", "closed_at"),
    "pg_balance_txns": ("btxn_id", "type", "direction", "amount_minor", "bucket_from", "bucket_to", "source_id",
                        "created_at"),
    "card_payments": ("payment_ref", "state", "authorised_minor", "captured_minor", "refunded_minor", "currency",
                      "version"),
    **dict.fromkeys(("paymos_invoices", "paymos_withdrawals", "paymos_channel_deposits"),
                    ("id", "status", "is_final", "updated_at_ms", "snapshot", "applied_seq")),
}
_JSON = {"fee_breakdown", "overpayment", "snapshot"}


def row_args(table: str, row: dict[str, Any]) -> list[Any]:
    return [orjson.dumps(row[c]).decode() if c in _JSON and row[c] is not None else row[c]
            for c in _COLUMNS[table]]


INSERT_FILL = """
INSERT INTO pg_withdrawal_fills (leg_ref, pg_withdrawal_id, sequence, amount_minor, fee_recognized_minor,
                                 settled_at, auto_confirm_at, balance_transaction_id)
VALUES ($1, $2, $3, $4, $5, $6::text::timestamptz, $7::text::timestamptz, $8)
ON CONFLICT (leg_ref) DO NOTHING"""

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

INSERT_LEDGER = """
INSERT INTO ledger_entries (entry_key, user_id, amount_minor, source_id) VALUES ($1, $2, $3, $4)
ON CONFLICT (entry_key) DO NOTHING"""

INSERT_ERROR = """
INSERT INTO projection_errors (kind, key, detail) VALUES ($1, $2, $3::jsonb) ON CONFLICT DO NOTHING"""

SELECT_OFFSETS = "SELECT partition, next_offset FROM projector_offsets WHERE consumer = $1 AND topic = $2"
LOCK_OFFSET = """
SELECT next_offset FROM projector_offsets WHERE consumer = $1 AND topic = $2 AND partition = $3 FOR UPDATE"""
UPSERT_OFFSET = """
INSERT INTO projector_offsets (consumer, topic, partition, next_offset) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset"""

# pg's sequence is one per merchant: an advisory lock serialises every projector instance on it.
LOCK_SEQUENCES = "SELECT pg_advisory_xact_lock(73556081)"
SELECT_SEQUENCE_MAX = "SELECT max_seen FROM pg_sequence_state WHERE merchant = 'pg'"
UPSERT_SEQUENCE_MAX = """
INSERT INTO pg_sequence_state (merchant, max_seen) VALUES ('pg', $1)
ON CONFLICT (merchant) DO UPDATE SET max_seen = EXCLUDED.max_seen"""
SELECT_GAPS = """
SELECT start_seq, end_seq, first_seen_at, backfill_requested_at FROM pg_sequence_gaps
 WHERE merchant = 'pg' ORDER BY start_seq"""
DELETE_GAP = "DELETE FROM pg_sequence_gaps WHERE merchant = 'pg' AND start_seq = $1"
INSERT_GAP = """
INSERT INTO pg_sequence_gaps (merchant, start_seq, end_seq, first_seen_at, backfill_requested_at)
VALUES ('pg', $1, $2, $3, $4)"""
MARK_BACKFILL_REQUESTED = """
UPDATE pg_sequence_gaps SET backfill_requested_at = now() WHERE merchant = 'pg' AND start_seq = $1"""

INSERT_CARD_EVENT = """
INSERT INTO card_events (gateway_event_id, payment_ref, event_type, sequence, occurred_at, received_at, payload, source)
VALUES ($1, $2, $3, $4, $5::text::timestamptz, $6::text::timestamptz, $7, $8)
ON CONFLICT (gateway_event_id) DO NOTHING"""
MARK_CARD_EVENT_APPLIED = """
UPDATE card_events SET applied_at = $2::text::timestamptz WHERE gateway_event_id = $1 AND applied_at IS NULL"""

INSERT_NOTE = """
INSERT INTO order_notes (note_key, resource_id, kind, body) VALUES ($1, $2, $3, $4) ON CONFLICT (note_key) DO NOTHING"""
