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

from datetime import UTC, datetime
from typing import Any

import orjson

from app.core.model import (
    APPLIED,
    DUPLICATE,
    PARKED,
    QUARANTINED,
    STALE,
    UNPARKED,
    Decision,
    Delivery,
    Effect,
    Fact,
    decide,
    numbered,
)

State = dict[str, Any]
DEPOSIT, WITHDRAWAL, BALANCE_TXN = "deposit", "withdrawal", "balance_transaction"


class Invalid(ValueError):
    """The snapshot cannot be stored as it is (e.g. money that breaks pg_deposit_money_ck)."""


def new_state() -> State:
    return {"n": 0, "kind": None, "version": None, "object": None, "seen": [], "correlation": None,
            "parked": [], "claims": {}, "credited_amount": None, "credited_at_ms": None,
            "reversed_at_ms": None, "closed_at_ms": None}


def _int(obj: dict[str, Any], name: str, required: bool = False) -> int | None:
    value = obj.get(name)
    if value is None and not required:
        return None
    # Money and versions are integers; a float or a bool is refused, never rounded.
    if not isinstance(value, int) or isinstance(value, bool):
        raise Invalid(f"{name} must be an integer, got {value!r}")
    return value


def check_deposit_money(obj: dict[str, Any]) -> None:
    """The database's pg_deposit_money_ck, checked before anything is stored."""
    if obj.get("status") not in ("settled", "reversed"):
        for name in ("ordered_amount_minor", "transferred_amount_minor", "amount_received_minor",
                     "fee_total_minor", "credited_amount_minor"):
            _int(obj, name)
        return
    ordered = _int(obj, "ordered_amount_minor", True)
    transferred = _int(obj, "transferred_amount_minor", True)
    received = _int(obj, "amount_received_minor", True)
    fee = _int(obj, "fee_total_minor", True)
    credited = _int(obj, "credited_amount_minor", True)
    assert ordered is not None and transferred is not None and received is not None
    assert fee is not None and credited is not None
    if not (ordered > 0 and transferred > 0 and received > 0
            and received == min(transferred, ordered)
            and 0 <= fee <= received and received - fee == credited):
        raise Invalid("amounts break pg_deposit_money_ck")


def _ms_to_iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _deposit_row(state: State) -> dict[str, Any]:
    o, c = state["object"], state["correlation"]
    return {
        "pg_deposit_id": o["id"], "pg_version": state["version"], "status": o.get("status"),
        "is_terminal": o.get("is_terminal"), "late_slip_accepted_until": o.get("late_slip_accepted_until"),
        "ordered_amount_minor": o.get("ordered_amount_minor"),
        "transferred_amount_minor": o.get("transferred_amount_minor"),
        "amount_received_minor": o.get("amount_received_minor"), "fee_total_minor": o.get("fee_total_minor"),
        "credited_amount_minor": o.get("credited_amount_minor"), "fee_breakdown": o.get("fee_breakdown"),
        "overpayment": o.get("overpayment"), "balance_transaction_id": o.get("balance_transaction_id"),
        "clearing_available_at": o.get("clearing_available_at"),
        "our_order_id": c["our_order_id"], "our_user_id": c["our_user_id"],
        "credited_user_at": _ms_to_iso(state["credited_at_ms"]), "reversed_at": _ms_to_iso(state["reversed_at_ms"]),
    }


def _withdrawal_row(state: State) -> dict[str, Any]:
    o = state["object"]
    return {
        "pg_withdrawal_id": o["id"], "pg_version": state["version"], "status": o.get("status"),
        "amount_total_minor": o.get("amount_total_minor"), "filled_minor": o.get("filled_minor") or 0,
        "remaining_minor": o.get("remaining_minor"), "fee_total_minor": o.get("fee_total_minor"),
        "fee_recognized_minor": o.get("fee_recognized_minor"), "refunded_minor": o.get("refunded_minor"),
        "settled_splits": o.get("settled_splits"), "our_payout_id": (o.get("metadata") or {}).get("payout_id"),
        "closed_at": _ms_to_iso(state["closed_at_ms"]),
    }


def _overpayment_fact(state: State, obj: dict[str, Any]) -> tuple[list[Fact], str | None]:
    flag = obj.get("overpayment")
    if not isinstance(flag, dict) or not flag.get("claim_id"):
        return [], None
    claim_id = str(flag["claim_id"])
    amount = flag.get("amount_minor")
    if (flag.get("cause") not in ("same_transfer_excess", "additional_transfer")
            or not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0
            or flag.get("status") != "open" or flag.get("action_required") != "contact_support"
            or not isinstance(flag.get("slip_received_at"), str)):
        return [], f"overpayment flag {claim_id} does not match the documented shape; not stored"
    seen = state["claims"].get(claim_id)
    if seen is not None and seen != flag:
        # Never swallowed: the first-seen flag stays, the decision carries the error.
        return [], f"overpayment claim_id {claim_id} collision: immutable flag content differs"
    if seen is None:
        state["claims"][claim_id] = flag
    fact = Fact("overpayment_flag", claim_id, {
        "claim_id": claim_id, "pg_deposit_id": obj["id"], "observed_deposit_version": obj["version"],
        "flag": flag})
    return [fact], None


def _deposit_effects(state: State, obj: dict[str, Any], event_id: str, d: Delivery) -> list[Effect]:
    dep, corr = obj["id"], state["correlation"]
    order_id, user_id = corr["our_order_id"], corr["our_user_id"]

    def effect(scope: str, kind: str, payload: dict[str, Any]) -> Effect:
        return Effect(f"{scope}:{kind}", kind, "pg", dep, payload, d.delivery_id)

    status = obj.get("status")
    if status == "settled":
        # 🔴 credit the end user with amount_received_minor (never credited_amount_minor), once
        if state["credited_amount"] is not None:
            return []
        amount = obj["amount_received_minor"]
        state["credited_amount"], state["credited_at_ms"] = amount, d.received_at_ms
        return [
            effect(f"deposit:{dep}", "credit_user", {"user_id": user_id, "order_id": order_id, "amount_minor": amount}),
            effect(f"deposit:{dep}", "release_goods", {
                "order_id": order_id, "partial": obj.get("partial") is True, "received": amount,
                "ordered": obj.get("ordered_amount_minor")}),
        ]
    if status == "reversed":
        # a debit only undoes a credit that happened, and only once
        if state["credited_amount"] is None or state["reversed_at_ms"] is not None:
            return []
        state["reversed_at_ms"] = d.received_at_ms
        return [
            effect(f"deposit:{dep}", "debit_user",
                   {"user_id": user_id, "order_id": order_id, "amount_minor": state["credited_amount"]}),
            effect(f"deposit:{dep}", "hold_goods", {"order_id": order_id}),
        ]
    if status in ("expired", "canceled"):
        # 🔴 not the end while a late slip can still be accepted
        if obj.get("is_terminal") is False and obj.get("late_slip_accepted_until"):
            return [effect(event_id, "show_late_slip", {"order_id": order_id,
                                                        "until": obj["late_slip_accepted_until"]})]
        return [effect(event_id, "fail_order", {"order_id": order_id,
                                                "reason": obj.get("cancel_reason_code") or "expired"})]
    if status == "under_review":
        reasons = (obj.get("review") or {}).get("reasons") or [{}]
        return [effect(event_id, "show_pending_review", {"order_id": order_id,
                                                         "message": reasons[0].get("display_th")})]
    if status == "rejected":
        return [effect(event_id, "fail_order", {"order_id": order_id,
                                                "reason": (obj.get("rejection") or {}).get("display_th")})]
    # default: the status enum may grow; a new value still reaches the merchant
    return [effect(event_id, "update_order_status", {"order_id": order_id, "status": status})]


def _guard_deposit(state: State, body: dict[str, Any], d: Delivery, applied_outcome: str) -> Decision:
    obj = body["data"]["object"]
    common = _common(body)
    facts, error = _overpayment_fact(state, obj)
    if state["version"] is not None and obj["version"] <= state["version"]:
        return decide(d, STALE, facts=facts, error=error, **common)
    state["version"], state["object"] = obj["version"], obj
    effects = _deposit_effects(state, obj, body["id"], d)
    return decide(d, applied_outcome, row=_deposit_row(state), table="pg_deposits", effects=effects, facts=facts,
                  error=error, **common)


def _guard_withdrawal(state: State, body: dict[str, Any], d: Delivery) -> Decision:
    obj = body["data"]["object"]
    common = _common(body)
    fill = body["data"].get("fill")
    # fill rows are appended keyed on leg_ref even when the totals are stale
    facts = [Fact("withdrawal_fill", str(fill["leg_ref"]), {**fill, "pg_withdrawal_id": obj["id"]})] \
        if isinstance(fill, dict) and fill.get("leg_ref") else []
    if state["version"] is not None and obj["version"] <= state["version"]:
        return decide(d, STALE, facts=facts, **common)
    state["version"], state["object"] = obj["version"], obj
    effects = []
    # the one way to close: a guard-approved settled snapshot with nothing remaining, once
    if obj.get("status") == "settled" and obj.get("remaining_minor") == 0 and state["closed_at_ms"] is None:
        state["closed_at_ms"] = d.received_at_ms
        payout_id = obj["metadata"]["payout_id"]
        effects.append(Effect(f"withdrawal:{obj['id']}:close_payout", "close_payout", "pg", obj["id"],
                              {"payout_id": payout_id}, d.delivery_id))
    return decide(d, APPLIED, row=_withdrawal_row(state), table="pg_withdrawals", effects=effects, facts=facts,
                  **common)


def _common(body: dict[str, Any]) -> dict[str, Any]:
    sequence = body.get("sequence")
    return {"event_id": body.get("id"), "event_type": body.get("type"),
            "sequence": sequence if isinstance(sequence, int) and not isinstance(sequence, bool) else None,
            "payload": body}


def _validate(kind: str, obj: dict[str, Any]) -> None:
    if not isinstance(obj.get("id"), str) or not obj["id"]:
        raise Invalid(f"{kind} without an id")
    if kind in (DEPOSIT, WITHDRAWAL):
        _int(obj, "version", True)
        if not isinstance(obj.get("status"), str) or not obj["status"]:
            raise Invalid(f"{kind} without a status")
    if kind == DEPOSIT:
        check_deposit_money(obj)
    elif kind == WITHDRAWAL:
        for name in ("amount_total_minor", "remaining_minor"):
            _int(obj, name, True)
        for name in ("filled_minor", "fee_total_minor", "fee_recognized_minor", "refunded_minor"):
            _int(obj, name)
        if not isinstance(obj.get("metadata"), dict) or not obj["metadata"].get("payout_id"):
            raise Invalid("withdrawal without metadata.payout_id")
    elif kind == BALANCE_TXN:
        _int(obj, "amount_minor", True)
        for name in ("type", "direction", "created_at"):
            if not isinstance(obj.get(name), str):
                raise Invalid(f"balance_transaction.{name} missing")


def apply_event(state: State | None, raw: bytes, d: Delivery) -> tuple[State, list[Decision]]:
    """Decide one pg delivery; returns the new state and the decisions (one per delivery touched)."""
    state = new_state() if state is None else state
    new, decisions = _apply_event(state, raw, d)
    return numbered(new, decisions)


def _apply_event(state: State, raw: bytes, d: Delivery) -> tuple[State, list[Decision]]:
    try:
        body = orjson.loads(raw)
        obj = body["data"]["object"]
        kind = obj["object"]
        event_id = body["id"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return state, [decide(d, QUARANTINED, error="unparseable pg event")]
    common = _common(body)
    if event_id in state["seen"]:
        return state, [decide(d, DUPLICATE, **common)]
    try:
        _validate(kind, obj)
    except Invalid as exc:
        return state, [decide(d, QUARANTINED, error=str(exc), **common)]
    if state["kind"] not in (None, kind):
        return state, [decide(d, QUARANTINED, error=f"{kind} event for a {state['kind']} resource", **common)]
    state["kind"] = kind
    state["seen"].append(event_id)

    if kind == BALANCE_TXN:
        # immutable, no version: dedupe on btxn_id and accumulate
        if state["object"] is not None:
            return state, [decide(d, DUPLICATE, **common)]
        state["object"] = obj
        row = {"btxn_id": obj["id"], "type": obj["type"], "direction": obj["direction"],
               "amount_minor": obj["amount_minor"], "bucket_from": obj.get("bucket_from"),
               "bucket_to": obj.get("bucket_to"), "source_id": (obj.get("source") or {}).get("id"),
               "created_at": obj["created_at"], "balance_after": obj.get("balance_after")}
        return state, [decide(d, APPLIED, row=row, table="pg_balance_txns", **common)]
    if kind == WITHDRAWAL:
        return state, [_guard_withdrawal(state, body, d)]
    if kind != DEPOSIT:
        return state, [decide(d, QUARANTINED, error=f"unknown object kind {kind!r}", **common)]
    if state["correlation"] is None:
        # The merchant's create-deposit response has not been stored yet: wait for it, visibly.
        state["parked"].append({"raw": raw.decode(), "delivery": d.__dict__})
        return state, [decide(d, PARKED, **common)]
    return state, [_guard_deposit(state, body, d, APPLIED)]


def apply_correlation(state: State | None, correlation: dict[str, Any], d: Delivery) -> tuple[State, list[Decision]]:
    """Store the deposit's correlation, then apply what was parked waiting for it."""
    state = new_state() if state is None else state
    new, decisions = _apply_correlation(state, correlation, d)
    return numbered(new, decisions)


def _apply_correlation(state: State, correlation: dict[str, Any], d: Delivery) -> tuple[State, list[Decision]]:
    common = {"event_type": "correlation.registered", "payload": correlation}
    if state["correlation"] is not None:
        if state["correlation"] == correlation:
            return state, [decide(d, DUPLICATE, **common)]
        return state, [decide(d, QUARANTINED, error="conflicting correlation for this deposit", **common)]
    state["correlation"] = correlation
    decisions = [decide(d, APPLIED, facts=[Fact("correlation", correlation["pg_deposit_id"], correlation)],
                        **common)]
    parked, state["parked"] = state["parked"], []
    # In log order, through the guard: exactly what would have been decided had the correlation
    # come before them, so a deposit's effects depend on the order of its webhooks in the log and
    # never on when the merchant's correlation arrived among them. (Newest first would suppress
    # superseded effects, e.g. a settled-then-reversed deposit would be neither credited nor
    # debited; but then the same webhooks gave other effects when the correlation came first.)
    for p in parked:
        delivery = Delivery(**p["delivery"])
        before = orjson.dumps(state)
        try:
            decisions.append(_guard_deposit(state, orjson.loads(p["raw"]), delivery, UNPARKED))
        except Exception as exc:  # one parked event must not take its correlation down
            # It was parked unchecked (the guard never saw it): set it aside with nothing of it applied.
            state.clear()
            state.update(orjson.loads(before))
            decisions.append(decide(delivery, QUARANTINED, error=f"parked event could not be applied: "
                                                                 f"{type(exc).__name__}: {exc}"[:500]))
    return state, decisions


def snapshot(state: State) -> dict[str, Any]:
    """The accepted state as published on orderly.state (for analytics and the timeline)."""
    return {"kind": state["kind"], "version": state["version"], "object": state["object"],
            "correlation": state["correlation"], "parked": len(state["parked"]),
            "credited_amount_minor": state["credited_amount"], "credited_at_ms": state["credited_at_ms"],
            "reversed_at_ms": state["reversed_at_ms"], "closed_at_ms": state["closed_at_ms"]}
