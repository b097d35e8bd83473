"""The paymos gateway's decisions: invoices, withdrawals, payment-channel deposits (pure layer;
gateway-docs/paymos-events.ru.txt, summarised in DESIGN.md §2.3).

- State comes from ``data.status`` / ``data.is_final``, never from the event name.
- Ordering key: ``(data.updated_at, rank of data.status)``; a snapshot that is not newer is stale.
- A terminal state ends the state machine, except the reorg transitions the document names
  (``invoice.awaiting_payment``, ``withdrawal.completion_rewound``, ``payment_channel.deposit.reorged``).
  Any other change out of a terminal state is parked, not dropped: if the reorg that explains it
  arrives later, it applies then.
- ``invoice.paid_late`` is a note (one per invoice, idempotent), never a transition.
- One-shot effects are keyed on the resource: an invoice is credited once and a channel deposit
  confirmed again after a reorg is not credited twice. A withdrawal's completion is keyed per
  cycle, so a payout reopened by ``completion_rewound`` can close again.
"""

from __future__ import annotations

import functools
import re
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
REORGS = frozenset({"invoice.awaiting_payment", "withdrawal.completion_rewound", "payment_channel.deposit.reorged"})
RANK = {  # the state machine's order, for ties on updated_at
    "awaiting_payment": 0, "confirming": 1, "underpaid_waiting": 2,
    "paid": 3, "paid_over": 3, "underpaid": 3, "expired": 3, "cancelled": 3,
    "created": 0, "signed": 1, "processing": 2, "completed": 3, "failed": 3,
    "reorged": 0, "confirmed": 2,
}
TABLE = {"invoice": "paymos_invoices", "withdrawal": "paymos_withdrawals",
         "payment_channel_deposit": "paymos_channel_deposits"}
INVOICE_EFFECTS = {"paid": "invoice_paid", "paid_over": "invoice_paid_over", "underpaid": "invoice_underpaid",
                   "expired": "invoice_expired", "cancelled": "invoice_cancelled"}
WITHDRAWAL_EFFECTS = {"completed": "payout_completed", "failed": "payout_failed", "cancelled": "payout_cancelled"}
DECIMAL = re.compile(r"^-?\d+(\.\d+)?$")


class Invalid(ValueError):
    pass


def _validate(data: Any) -> None:
    if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
        raise Invalid("data.id missing")
    if not isinstance(data.get("status"), str) or not isinstance(data.get("is_final"), bool):
        raise Invalid("data.status or data.is_final missing")
    if not isinstance(data.get("updated_at"), int) or isinstance(data.get("updated_at"), bool):
        raise Invalid("data.updated_at must be integer unix milliseconds")
    for name, value in data.items():
        # crypto amounts are decimal strings end to end; a float has already lost precision
        if isinstance(value, float):
            raise Invalid(f"data.{name} is a float; amounts must be decimal strings")
        if is_amount(name) and value is not None and not (
                isinstance(value, str) and DECIMAL.match(value)):
            raise Invalid(f"data.{name} must be a decimal string, got {value!r}")


# A field of ``data`` is an amount when a word of its name (between underscores) is amount, net or
# fee: "amount", "net", "amount_paid", "network_fee"; not "network" or "feedback".
AMOUNT_FIELD = re.compile(r"(?:^|_)(?:amount|net|fee)(?:_|$)")


@functools.lru_cache(maxsize=1024)  # called per field of every event; a body's field names are few
def is_amount(name: str) -> bool:
    return AMOUNT_FIELD.search(name) is not None


def _key(data: dict[str, Any]) -> tuple[int, int]:
    return data["updated_at"], RANK.get(data["status"], 1)


def new_state() -> State:
    return {"n": 0, "applied": 0, "kind": None, "snapshot": None, "seen": [], "parked": [], "emitted": [],
            "cycle": 0, "noted": False}


def _effects(state: State, event_type: str, data: dict[str, Any], d: Delivery) -> list[Effect]:
    rid, status, kind = data["id"], data["status"], data["object"]

    def effect(name: str, payload: dict[str, Any], scope: str | None = None, slot: str | None = None) -> Effect | None:
        key = f"paymos:{rid}:{slot or name}" + (f":{scope}" if scope else "")
        if key in state["emitted"]:
            return None
        state["emitted"].append(key)
        return Effect(key, name, "paymos", rid, payload, d.delivery_id)

    amounts = {k: v for k, v in data.items() if is_amount(k)}
    found: list[Effect | None] = []
    if kind == "invoice" and status in INVOICE_EFFECTS:
        name = INVOICE_EFFECTS[status]
        # paid and paid_over both credit the merchant: one credit slot per invoice, whatever detour
        slot = "credit" if name in ("invoice_paid", "invoice_paid_over") else None
        found.append(effect(name, {"invoice_id": rid, "status": status, **amounts}, slot=slot))
    elif kind == "withdrawal":
        if event_type == "withdrawal.completion_rewound":
            found.append(effect("payout_reopened", {"withdrawal_id": rid, "status": status}, str(state["cycle"])))
            state["cycle"] += 1
        elif status in WITHDRAWAL_EFFECTS:
            found.append(effect(WITHDRAWAL_EFFECTS[status], {"withdrawal_id": rid, "status": status, **amounts},
                                str(state["cycle"])))
    elif kind == "payment_channel_deposit" and status == "confirmed":
        # the net amount, once: a deposit confirmed again after a reorg is not credited twice
        found.append(effect("credit_channel_deposit", {"deposit_id": rid, **amounts}))
    return [e for e in found if e is not None]


def _allowed(state: State, event_type: str, data: dict[str, Any]) -> bool:
    current = state["snapshot"]
    if current is None or not current["is_final"]:
        return True
    # terminal: only the named reorgs (or a newer snapshot of the same status) may follow
    return event_type in REORGS or data["status"] == current["status"]


def _apply(state: State, body: dict[str, Any], d: Delivery, outcome: str) -> Decision:
    data = body["data"]
    state["snapshot"] = data
    state["applied"] += 1
    row = {"id": data["id"], "status": data["status"], "is_final": data["is_final"],
           "updated_at_ms": data["updated_at"], "snapshot": data, "applied_seq": state["applied"]}
    effects = _effects(state, body["event_type"], data, d)
    return decide(d, outcome, row=row, table=TABLE[data["object"]], effects=effects, **_common(body))


def _common(body: dict[str, Any]) -> dict[str, Any]:
    return {"event_id": body.get("event_id"), "event_type": body.get("event_type"), "payload": body}


def _retry_parked(state: State) -> list[Decision]:
    """After a change, parked snapshots get another chance, oldest first; older ones turn stale."""
    out: list[Decision] = []
    progressed = True
    while progressed and state["parked"]:
        progressed = False
        for p in sorted(state["parked"], key=lambda p: _key(p["body"]["data"])):
            body, d = p["body"], Delivery(**p["delivery"])
            if _key(body["data"]) <= _key(state["snapshot"]):
                state["parked"].remove(p)
                out.append(decide(d, STALE, **_common(body)))
                progressed = True
                break
            if _allowed(state, body["event_type"], body["data"]):
                state["parked"].remove(p)
                out.append(_apply(state, body, d, UNPARKED))
                progressed = True
                break
    return out


def apply_event(state: State | None, raw: bytes, d: Delivery) -> tuple[State, list[Decision]]:
    state = new_state() if state is None else state
    try:
        body = orjson.loads(raw)
        event_id, event_type, data = body["event_id"], body["event_type"], body["data"]
        _validate(data)
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        return numbered(state, [decide(d, QUARANTINED, error=f"unusable paymos event: {exc}")])
    except Invalid as exc:
        return numbered(state, [decide(d, QUARANTINED, error=str(exc), **_common(body))])
    if event_id in state["seen"]:
        return numbered(state, [decide(d, DUPLICATE, **_common(body))])  # a redelivery, not a transition
    state["seen"].append(event_id)
    if state["kind"] not in (None, data["object"]):
        return numbered(state, [decide(d, QUARANTINED, error="object kind changed", **_common(body))])
    state["kind"] = data["object"]

    if event_type == "invoice.paid_late":
        # a note beside the terminal decision, never a transition: one per invoice
        if state["noted"]:
            return numbered(state, [decide(d, DUPLICATE, **_common(body))])
        state["noted"] = True
        note = {"note_key": f"paymos:{data['id']}:paid_late", "resource_id": data["id"], "kind": "paid_late",
                "body": f"paid in full after closing as {data['status']} (paid_late_at {data.get('paid_late_at')})"}
        effect = Effect(f"paymos:{data['id']}:add_order_note", "add_order_note", "paymos", data["id"],
                        {"invoice_id": data["id"], "note": note["body"]}, d.delivery_id)
        return numbered(state, [decide(d, APPLIED, facts=[Fact("order_note", note["note_key"], note)],
                                       effects=[effect], **_common(body))])

    if state["snapshot"] is not None and _key(data) <= _key(state["snapshot"]):
        return numbered(state, [decide(d, STALE, **_common(body))])
    if not _allowed(state, event_type, data):
        state["parked"].append({"body": body, "delivery": d.__dict__})
        return numbered(state, [decide(d, PARKED, error="change out of a terminal state waits for its reorg",
                                       **_common(body))])
    decisions = [_apply(state, body, d, APPLIED)]
    decisions += _retry_parked(state)
    return numbered(state, decisions)


def snapshot(state: State) -> dict[str, Any]:
    return {"kind": state["kind"], "snapshot": state["snapshot"], "parked": len(state["parked"]),
            "emitted": state["emitted"], "noted": state["noted"]}
