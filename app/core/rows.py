"""The read-model rows the reducers write into their decisions (pure layer): one TypedDict per
table, in the field order the decisions' JSON has always had (the projector reads them by name,
projections/ maps them to columns). Values the gateway sent and Orderly does not read stay opaque
(:data:`app.gateways.schema.Json`).
"""

from __future__ import annotations

from typing import TypedDict

from app.gateways.schema import Json


class CardPaymentRow(TypedDict):
    payment_ref: str
    state: str
    authorised_minor: int
    captured_minor: int
    refunded_minor: int
    currency: str | None
    version: int  # the payment's stored events: they only accumulate, a newer row has more


class PaymosRow(TypedDict):
    """An invoice, a withdrawal or a channel deposit (paymos_invoices, _withdrawals, _channel_deposits)."""

    id: str
    status: str
    is_final: bool
    updated_at_ms: int
    snapshot: Json  # the applied ``data`` as the gateway sent it (written once, an orjson.Fragment)
    applied_seq: int


class PgDepositRow(TypedDict):
    pg_deposit_id: str
    pg_version: int
    status: str
    is_terminal: bool | None
    late_slip_accepted_until: str | None
    ordered_amount_minor: int | None
    transferred_amount_minor: int | None
    amount_received_minor: int | None
    fee_total_minor: int | None
    credited_amount_minor: int | None
    fee_breakdown: Json  # jsonb, as sent
    overpayment: Json  # jsonb, as sent
    balance_transaction_id: str | None
    clearing_available_at: str | None
    our_order_id: str
    our_user_id: str
    credited_user_at: str | None
    reversed_at: str | None


class PgWithdrawalRow(TypedDict):
    pg_withdrawal_id: str
    pg_version: int
    status: str
    amount_total_minor: int
    filled_minor: int
    remaining_minor: int
    fee_total_minor: int | None
    fee_recognized_minor: int | None
    refunded_minor: int | None
    settled_splits: int | None
    our_payout_id: str
    closed_at: str | None


class PgBalanceTxnRow(TypedDict):
    btxn_id: str
    type: str
    direction: str
    amount_minor: int
    bucket_from: str | None
    bucket_to: str | None
    source_id: str | None
    created_at: str
    balance_after: int | None
