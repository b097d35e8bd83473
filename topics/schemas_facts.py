"""The typed records of orderly.facts: the record itself and its ``data`` per fact kind (schema layer).

The worker writes each fact as ``{kind, key, gateway, resource_id, data}`` (app/core/dispatch.py);
``data``'s shape depends on ``kind``. These types are the published contract of that shape (the
JSON Schemas in docs/schemas/ are generated from them); tests/unit/test_analytics_schemas.py
validates the facts the real core writes against them, so the two cannot drift apart.
Optional fields are those a fact may lack; every field listed is written when the gateway sent it.
"""

from __future__ import annotations

from typing import Any

import msgspec


class FactRecord(msgspec.Struct):
    """One record of orderly.facts (key: the fact's own id, ``key``)."""

    kind: str
    key: str
    gateway: str
    resource_id: str
    data: dict[str, Any]


class OverpaymentFlag(msgspec.Struct):
    """pg: an immutable overpayment flag of a deposit, keyed on its claim_id."""

    claim_id: str
    pg_deposit_id: str
    observed_deposit_version: int
    flag: dict[str, Any]  # data.object.overpayment as the gateway sent it (first seen wins)


class WithdrawalFill(msgspec.Struct):
    """pg: one chunk of a withdrawal (data.fill as sent, with its withdrawal's id), keyed on leg_ref."""

    leg_ref: str
    amount_minor: int
    pg_withdrawal_id: str
    sequence: int | None = None
    fee_recognized_minor: int | None = None
    settled_at: str | None = None
    auto_confirm_at: str | None = None
    balance_transaction_id: str | None = None


class CorrelationFact(msgspec.Struct):
    """pg: the merchant's mapping of a deposit, keyed on pg_deposit_id."""

    pg_deposit_id: str
    merchant_reference: str
    our_order_id: str
    our_user_id: str


class CardEvent(msgspec.Struct):
    """card: an event as stored (webhook or fetched), keyed on its gateway event id."""

    gateway_event_id: str
    payment_ref: str
    event_type: str
    sequence: int | None
    occurred_at: str  # ISO 8601, UTC
    received_at: str  # ISO 8601, UTC
    payload: str  # the body as received, a JSON text
    source: str  # "webhook" or "fetch"


class CardEventApplied(msgspec.Struct):
    """card: a stored event became part of the payment's applied history, keyed on its event id."""

    gateway_event_id: str
    applied_at: str  # ISO 8601, UTC: when the delivery that applied it was received


class OrderNote(msgspec.Struct):
    """paymos: a note beside an invoice (paid after it closed), keyed on note_key."""

    note_key: str
    resource_id: str
    kind: str
    body: str


class StripeFetch(msgspec.Struct):
    """stripe: a thin event whose object is to be fetched, keyed ``stripe:<id>:fetch:<event id>``."""

    gateway: str
    resource_id: str
    event_id: str
    reason: str


# kind -> the type of its data (a kind is added here when a reducer starts writing it)
FACT_DATA: dict[str, type[msgspec.Struct]] = {
    "overpayment_flag": OverpaymentFlag,
    "withdrawal_fill": WithdrawalFill,
    "correlation": CorrelationFact,
    "card_event": CardEvent,
    "card_event_applied": CardEventApplied,
    "order_note": OrderNote,
    "stripe_fetch": StripeFetch,
}
