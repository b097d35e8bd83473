"""The pg gateway's decisions: version guard, correlation parking, effects and facts (pure layer).

This is gateway-docs/pg-event-order-version-guard.txt restated for a stream. The worker that owns
a resource's partition is the "single SQL statement": it holds the resource's state and decides
each delivery with these functions. The rules it enforces:

- State comes from ``data.object``, never from ``event.type``.
- A snapshot is applied iff its version is greater than the stored one; anything else is stale,
  changes nothing and emits no effect. The one exception: a previously unseen overpayment flag is
  still appended (a fact), and a claim_id seen with other content is surfaced as an error.
- One-shot effects are keyed on the resource (``deposit:{id}:credit_user``) so no later event can
  repeat them; snapshot effects are keyed on the event id.
- A deposit event whose correlation has not arrived is parked; when it arrives, the parked events
  are applied in log order, as if it had been there first.
"""

from __future__ import annotations

import msgspec
import orjson

from app.core.model import (
    APPLIED,
    DUPLICATE,
    PARKED,
    QUARANTINED,
    STALE,
    UNPARKED,
    Common,
    Decision,
    Delivery,
    Effect,
    Fact,
    Recent,
    decide,
    numbered,
)
from app.core.reducer import Reducer, state_codec
from app.core.rows import PgBalanceTxnRow, PgDepositRow, PgWithdrawalRow
from app.core.times import iso_ms
from app.gateways.pg import BalanceTransaction, Deposit, Webhook, Withdrawal, read
from app.gateways.schema import Json
from topics.records import Correlation

DEPOSIT, WITHDRAWAL, BALANCE_TXN = "deposit", "withdrawal", "balance_transaction"
NULL = msgspec.Raw(b"null")


class Invalid(ValueError):
    """The snapshot cannot be stored as it is (e.g. money that breaks pg_deposit_money_ck)."""


class Parked(msgspec.Struct, gc=False):
    """A deposit event waiting for its correlation: its body exactly as received."""

    raw: str
    delivery: Delivery


# The JSON of this state is what orderly.state's changelog has always held (a dict in release 0.2):
# the fields in this order, the last applied ``object`` and each claim's flag as orjson wrote them
# (carried as raw JSON, never decoded again), so a stored state decodes and writes back unchanged.
class State(msgspec.Struct, gc=False):
    """One pg resource (a deposit, a withdrawal or a balance transaction) as the worker holds it."""

    n: int = 0
    kind: str | None = None
    version: int | None = None
    object: msgspec.Raw = NULL  # the last applied data.object
    seen: list[str] = msgspec.field(default_factory=list)  # event ids
    correlation: Correlation | None = None
    parked: list[Parked] = msgspec.field(default_factory=list)
    claims: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)  # claim_id -> the first flag seen
    credited_amount: int | None = None
    credited_at_ms: int | None = None
    reversed_at_ms: int | None = None
    closed_at_ms: int | None = None
    recent: Recent = msgspec.field(default_factory=list, name="_recent")


class Snapshot(msgspec.Struct, gc=False):
    """The accepted state as published on orderly.state (for analytics and the timeline)."""

    kind: str | None
    version: int | None
    object: msgspec.Raw
    correlation: Correlation | None
    parked: int
    credited_amount_minor: int | None
    credited_at_ms: int | None
    reversed_at_ms: int | None
    closed_at_ms: int | None


load, dump = state_codec(State)
_encode = msgspec.json.Encoder().encode  # the snapshot's


def _required(name: str, value: int | None) -> int:
    # Money is an integer (the schema has made it one); a settled snapshot must carry it.
    if value is None:
        raise Invalid(f"{name} must be an integer, got None")
    return value


def check_deposit_money(obj: Deposit) -> None:
    """The database's pg_deposit_money_ck, checked before anything is stored."""
    if obj.status not in ("settled", "reversed"):
        return
    ordered = _required("ordered_amount_minor", obj.ordered_amount_minor)
    transferred = _required("transferred_amount_minor", obj.transferred_amount_minor)
    received = _required("amount_received_minor", obj.amount_received_minor)
    fee = _required("fee_total_minor", obj.fee_total_minor)
    credited = _required("credited_amount_minor", obj.credited_amount_minor)
    # the CHECK's amount_received_minor > 0 follows from its being the lesser of two positive amounts
    if not (ordered > 0 and transferred > 0 and received == min(transferred, ordered)
            and 0 <= fee <= received and received - fee == credited):
        raise Invalid("amounts break pg_deposit_money_ck")


def _ms_to_iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return iso_ms(ms)


def _deposit_row(state: State, o: Deposit, flag: Json, c: Correlation) -> PgDepositRow:
    # called once the guard took ``o``: the state's version is o.version
    # fee_breakdown and overpayment as the gateway sent them (jsonb), with the fields it added
    return {
        "pg_deposit_id": o.id, "pg_version": o.version, "status": o.status,
        "is_terminal": o.is_terminal, "late_slip_accepted_until": o.late_slip_accepted_until,
        "ordered_amount_minor": o.ordered_amount_minor,
        "transferred_amount_minor": o.transferred_amount_minor,
        "amount_received_minor": o.amount_received_minor, "fee_total_minor": o.fee_total_minor,
        "credited_amount_minor": o.credited_amount_minor, "fee_breakdown": o.fee_breakdown,
        "overpayment": flag, "balance_transaction_id": o.balance_transaction_id,
        "clearing_available_at": o.clearing_available_at,
        "our_order_id": c.our_order_id, "our_user_id": c.our_user_id,
        "credited_user_at": _ms_to_iso(state.credited_at_ms), "reversed_at": _ms_to_iso(state.reversed_at_ms),
    }


def _withdrawal_row(state: State, o: Withdrawal) -> PgWithdrawalRow:
    return {
        "pg_withdrawal_id": o.id, "pg_version": o.version, "status": o.status,
        "amount_total_minor": o.amount_total_minor, "filled_minor": o.filled_minor or 0,
        "remaining_minor": o.remaining_minor, "fee_total_minor": o.fee_total_minor,
        "fee_recognized_minor": o.fee_recognized_minor, "refunded_minor": o.refunded_minor,
        "settled_splits": o.settled_splits, "our_payout_id": o.metadata.payout_id,
        "closed_at": _ms_to_iso(state.closed_at_ms),
    }


def _overpayment_fact(state: State, obj: Deposit, flag: Json) -> tuple[list[Fact], str | None]:
    typed = obj.overpayment
    if typed is None or not typed.claim_id:
        return [], None
    claim_id = typed.claim_id
    if (typed.cause not in ("same_transfer_excess", "additional_transfer")
            or typed.amount_minor is None or typed.amount_minor <= 0
            or typed.status != "open" or typed.action_required != "contact_support"
            or typed.slip_received_at is None):
        return [], f"overpayment flag {claim_id} does not match the documented shape; not stored"
    seen = state.claims.get(claim_id)
    # compared as JSON values, not as bytes: the same flag with its fields in another order is the same flag
    if seen is not None and orjson.loads(memoryview(seen)) != flag:
        # Never swallowed: the first-seen flag stays, the decision carries the error.
        return [], f"overpayment claim_id {claim_id} collision: immutable flag content differs"
    if seen is None:
        state.claims[claim_id] = msgspec.Raw(orjson.dumps(flag))
    fact = Fact("overpayment_flag", claim_id, {
        "claim_id": claim_id, "pg_deposit_id": obj.id, "observed_deposit_version": obj.version,
        "flag": flag})
    return [fact], None


def _deposit_effects(state: State, obj: Deposit, c: Correlation, event_id: str, d: Delivery) -> list[Effect]:
    dep, order_id, user_id = obj.id, c.our_order_id, c.our_user_id
    status, scope = obj.status, f"deposit:{obj.id}"
    if status == "settled":
        # 🔴 credit the end user with amount_received_minor (never credited_amount_minor), once
        if state.credited_amount is not None:
            return []
        amount = obj.amount_received_minor
        state.credited_amount, state.credited_at_ms = amount, d.received_at_ms
        return [
            Effect(f"{scope}:credit_user", "credit_user", "pg", dep,
                   {"user_id": user_id, "order_id": order_id, "amount_minor": amount}, d.delivery_id),
            Effect(f"{scope}:release_goods", "release_goods", "pg", dep, {
                "order_id": order_id, "partial": obj.partial is True, "received": amount,
                "ordered": obj.ordered_amount_minor}, d.delivery_id),
        ]
    if status == "reversed":
        # a debit only undoes a credit that happened, and only once
        if state.credited_amount is None or state.reversed_at_ms is not None:
            return []
        state.reversed_at_ms = d.received_at_ms
        return [
            Effect(f"{scope}:debit_user", "debit_user", "pg", dep,
                   {"user_id": user_id, "order_id": order_id, "amount_minor": state.credited_amount},
                   d.delivery_id),
            Effect(f"{scope}:hold_goods", "hold_goods", "pg", dep, {"order_id": order_id}, d.delivery_id),
        ]
    if status in ("expired", "canceled"):
        # 🔴 not the end while a late slip can still be accepted
        if obj.is_terminal is False and obj.late_slip_accepted_until:
            return [Effect(f"{event_id}:show_late_slip", "show_late_slip", "pg", dep,
                           {"order_id": order_id, "until": obj.late_slip_accepted_until}, d.delivery_id)]
        return [Effect(f"{event_id}:fail_order", "fail_order", "pg", dep,
                       {"order_id": order_id, "reason": obj.cancel_reason_code or "expired"}, d.delivery_id)]
    if status == "under_review":
        reasons = (obj.review.reasons if obj.review is not None else None) or []
        return [Effect(f"{event_id}:show_pending_review", "show_pending_review", "pg", dep,
                       {"order_id": order_id, "message": reasons[0].display_th if reasons else None},
                       d.delivery_id)]
    if status == "rejected":
        return [Effect(f"{event_id}:fail_order", "fail_order", "pg", dep,
                       {"order_id": order_id, "reason": obj.rejection.display_th if obj.rejection else None},
                       d.delivery_id)]
    # default: the status enum may grow; a new value still reaches the merchant
    return [Effect(f"{event_id}:update_order_status", "update_order_status", "pg", dep,
                   {"order_id": order_id, "status": status}, d.delivery_id)]


def _guard_deposit(state: State, w: Webhook, obj: Deposit, c: Correlation, d: Delivery,
                   applied_outcome: str) -> Decision:
    event = w.event
    # the flag as sent, with the fields the gateway added (read only where the deposit has one)
    flag = w.overpayment() if obj.overpayment is not None else None
    facts, error = _overpayment_fact(state, obj, flag)
    if state.version is not None and obj.version <= state.version:
        return decide(d, STALE, facts=facts, error=error, event_id=event.id, event_type=event.type,
                      sequence=event.sequence, payload=w.payload)
    state.version, state.object = obj.version, w.object
    effects = _deposit_effects(state, obj, c, event.id, d)
    return decide(d, applied_outcome, row=_deposit_row(state, obj, flag, c), table="pg_deposits",
                  effects=effects, facts=facts, error=error, event_id=event.id, event_type=event.type,
                  sequence=event.sequence, payload=w.payload)


def _guard_withdrawal(state: State, w: Webhook, obj: Withdrawal, d: Delivery) -> Decision:
    event, fill = w.event, w.fill_fields()
    # fill rows are appended keyed on leg_ref even when the totals are stale
    facts = [Fact("withdrawal_fill", str(fill["leg_ref"]), {**fill, "pg_withdrawal_id": obj.id})] \
        if fill is not None else []
    if state.version is not None and obj.version <= state.version:
        return decide(d, STALE, facts=facts, event_id=event.id, event_type=event.type, sequence=event.sequence,
                      payload=w.payload)
    state.version, state.object = obj.version, w.object
    effects = []
    # the one way to close: a guard-approved settled snapshot with nothing remaining, once
    if obj.status == "settled" and obj.remaining_minor == 0 and state.closed_at_ms is None:
        state.closed_at_ms = d.received_at_ms
        effects.append(Effect(f"withdrawal:{obj.id}:close_payout", "close_payout", "pg", obj.id,
                              {"payout_id": obj.metadata.payout_id}, d.delivery_id))
    return decide(d, APPLIED, row=_withdrawal_row(state, obj), table="pg_withdrawals", effects=effects, facts=facts,
                  event_id=event.id, event_type=event.type, sequence=event.sequence, payload=w.payload)


def apply_event(state: State | None, w: Webhook, d: Delivery) -> tuple[State, list[Decision]]:
    """Decide one pg delivery; returns the new state and the decisions (one per delivery touched)."""
    state = State() if state is None else state
    new, decisions = _apply_event(state, w, d)
    return numbered(new, decisions)


def _apply_event(state: State, w: Webhook, d: Delivery) -> tuple[State, list[Decision]]:
    event = w.event
    obj = event.data.object
    kind = str(obj.__struct_config__.tag)  # the tag the schema read the object by
    common: Common = {"event_id": event.id, "event_type": event.type, "sequence": event.sequence,
                              "payload": w.payload}
    if event.id in state.seen:
        return state, [decide(d, DUPLICATE, **common)]
    if isinstance(obj, Deposit):
        try:
            check_deposit_money(obj)
        except Invalid as exc:
            return state, [decide(d, QUARANTINED, error=str(exc), **common)]
    if state.kind not in (None, kind):
        return state, [decide(d, QUARANTINED, error=f"{kind} event for a {state.kind} resource", **common)]
    state.kind = kind
    state.seen.append(event.id)

    if isinstance(obj, BalanceTransaction):
        # immutable, no version: dedupe on btxn_id and accumulate
        if state.object != NULL:
            return state, [decide(d, DUPLICATE, **common)]
        state.object = w.object
        row: PgBalanceTxnRow = {
            "btxn_id": obj.id, "type": obj.type, "direction": obj.direction, "amount_minor": obj.amount_minor,
            "bucket_from": obj.bucket_from, "bucket_to": obj.bucket_to,
            "source_id": obj.source.id if obj.source is not None else None,
            "created_at": obj.created_at, "balance_after": obj.balance_after}
        return state, [decide(d, APPLIED, row=row, table="pg_balance_txns", **common)]
    if isinstance(obj, Withdrawal):
        return state, [_guard_withdrawal(state, w, obj, d)]
    if state.correlation is None:
        # The merchant's create-deposit response has not been stored yet: wait for it, visibly.
        state.parked.append(Parked(w.raw.decode(), d))
        return state, [decide(d, PARKED, **common)]
    return state, [_guard_deposit(state, w, obj, state.correlation, d, APPLIED)]


def read_correlation(raw: bytes) -> Correlation:
    """A correlation record's body (the merchant's mapping, as the ingest wrote it); read by orjson
    as before, so what cannot be read is set aside with the same reason."""
    return msgspec.convert(orjson.loads(raw), Correlation)


def apply_correlation(state: State | None, correlation: Correlation, d: Delivery) -> tuple[State, list[Decision]]:
    """Store the deposit's correlation, then apply what was parked waiting for it."""
    state = State() if state is None else state
    new, decisions = _apply_correlation(state, correlation, d)
    return numbered(new, decisions)


def _apply_correlation(state: State, correlation: Correlation, d: Delivery) -> tuple[State, list[Decision]]:
    as_dict = {"pg_deposit_id": correlation.pg_deposit_id, "merchant_reference": correlation.merchant_reference,
               "our_order_id": correlation.our_order_id, "our_user_id": correlation.our_user_id}
    common: Common = {"event_type": "correlation.registered", "payload": as_dict}
    if state.correlation is not None:
        if state.correlation == correlation:
            return state, [decide(d, DUPLICATE, **common)]
        return state, [decide(d, QUARANTINED, error="conflicting correlation for this deposit", **common)]
    state.correlation = correlation
    decisions = [decide(d, APPLIED, facts=[Fact("correlation", correlation.pg_deposit_id, as_dict)], **common)]
    parked, state.parked = state.parked, []
    # In log order, through the guard: exactly what would have been decided had the correlation
    # come before them, so a deposit's effects depend on the order of its webhooks in the log and
    # never on when the merchant's correlation arrived among them. (Newest first would suppress
    # superseded effects, e.g. a settled-then-reversed deposit would be neither credited nor
    # debited; but then the same webhooks gave other effects when the correlation came first.)
    for p in parked:
        before = dump(state)
        try:
            # It was parked unchecked (the guard never saw it): read it now, as the ingest would have.
            w = read(p.raw.encode(), checked=True)
            if not isinstance(w, Webhook):
                raise Invalid(w.quarantine_reason or "refused by its adapter")
            if not isinstance(w.event.data.object, Deposit):
                raise Invalid(f"a parked {w.event.data.object.__struct_config__.tag} event")
            decisions.append(_guard_deposit(state, w, w.event.data.object, correlation, p.delivery, UNPARKED))
        except Exception as exc:  # one parked event must not take its correlation down
            # set aside with nothing of it applied
            restored = load(before)
            for name in State.__struct_fields__:
                setattr(state, name, getattr(restored, name))
            decisions.append(decide(p.delivery, QUARANTINED, error=f"parked event could not be applied: "
                                                                   f"{type(exc).__name__}: {exc}"[:500]))
    return state, decisions


def snapshot(state: State) -> bytes:
    """The accepted state as published on orderly.state (for analytics and the timeline)."""
    return _encode(Snapshot(state.kind, state.version, state.object, state.correlation, len(state.parked),
                            state.credited_amount, state.credited_at_ms, state.reversed_at_ms, state.closed_at_ms))


def correlate(state: State | None, raw: bytes, d: Delivery) -> tuple[State, list[Decision]]:
    """A correlation record of orderly.raw decided on the deposit's state."""
    return apply_correlation(state, read_correlation(raw), d)


REDUCER: Reducer[State, Webhook] = Reducer(read, apply_event, load, dump, snapshot, correlate, snapshot_type=Snapshot)
