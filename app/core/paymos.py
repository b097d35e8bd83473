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
from app.core.rows import PaymosRow
from app.gateways.paymos import Resource, Webhook, is_amount, read
from app.gateways.schema import Document

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
NULL = msgspec.Raw(b"null")
# Snapshots parked per resource: beyond, quarantined. Each change re-tries every parked one, so
# without a bound a stream of changes out of a terminal state made one reorg cost minutes (at
# 1,000, 0.65 s); a real resource parks a handful.
MAX_PARKED = 1000


class Parked(msgspec.Struct, gc=False):
    """A change out of a terminal state waiting for its reorg: its body as received."""

    body: msgspec.Raw
    delivery: Delivery


# The JSON of this state is what orderly.state's changelog has always held (a dict in release 0.2):
# the fields in this order, the applied ``data`` as orjson wrote it and parked bodies as received (raw JSON).
class State(msgspec.Struct, gc=False):
    """One paymos resource (an invoice, a withdrawal or a channel deposit) as the worker holds it."""

    n: int = 0
    applied: int = 0
    kind: str | None = None
    snapshot: msgspec.Raw = NULL  # the last applied ``data``
    seen: list[str] = msgspec.field(default_factory=list)
    parked: list[Parked] = msgspec.field(default_factory=list)
    emitted: list[str] = msgspec.field(default_factory=list)
    cycle: int = 0
    noted: bool = False
    recent: Recent = msgspec.field(default_factory=list, name="_recent")


class Current(msgspec.Struct, gc=False):
    """What the guard reads of the applied snapshot."""

    status: str
    is_final: bool
    updated_at: int


class Snapshot(msgspec.Struct, gc=False):
    kind: str | None
    snapshot: msgspec.Raw
    parked: int
    emitted: list[str]
    noted: bool


load, dump = state_codec(State)
_CURRENT = msgspec.json.Decoder(Current)
_encode = msgspec.json.Encoder().encode  # the snapshot's


def _key(data: Resource | Current) -> tuple[int, int]:
    return data.updated_at, RANK.get(data.status, 1)


def _current(state: State) -> Current | None:
    return None if state.snapshot == NULL else _CURRENT.decode(state.snapshot)


def _effect(state: State, rid: str, d: Delivery, name: str, payload: Document, scope: str | None = None,
            slot: str | None = None) -> list[Effect]:
    """The effect, once per key: none if its key was emitted before."""
    key = f"paymos:{rid}:{slot or name}" + (f":{scope}" if scope else "")
    if key in state.emitted:
        return []
    state.emitted.append(key)
    return [Effect(key, name, "paymos", rid, payload, d.delivery_id)]


def _amounts(w: Webhook) -> Document:
    amounts: Document = {}  # decimal strings, as sent (a loop: a comprehension has a frame of its own)
    for k, v in w.fields().items():
        if is_amount(k):
            amounts[k] = v
    return amounts


def _effects(state: State, event_type: str, w: Webhook, d: Delivery) -> list[Effect]:
    resource = w.resource
    rid, status, kind = resource.id, resource.status, resource.object
    if kind == "invoice" and status in INVOICE_EFFECTS:
        name = INVOICE_EFFECTS[status]
        # paid and paid_over both credit the merchant: one credit slot per invoice, whatever detour
        slot = "credit" if name in ("invoice_paid", "invoice_paid_over") else None
        return _effect(state, rid, d, name, {"invoice_id": rid, "status": status, **_amounts(w)}, slot=slot)
    if kind == "withdrawal":
        if event_type == "withdrawal.completion_rewound":
            found = _effect(state, rid, d, "payout_reopened", {"withdrawal_id": rid, "status": status},
                            str(state.cycle))
            state.cycle += 1
            return found
        if status in WITHDRAWAL_EFFECTS:
            return _effect(state, rid, d, WITHDRAWAL_EFFECTS[status],
                           {"withdrawal_id": rid, "status": status, **_amounts(w)}, str(state.cycle))
    elif kind == "payment_channel_deposit" and status == "confirmed":
        # the net amount, once: a deposit confirmed again after a reorg is not credited twice
        return _effect(state, rid, d, "credit_channel_deposit", {"deposit_id": rid, **_amounts(w)})
    return []


def _allowed(current: Current | None, w: Webhook) -> bool:
    if current is None or not current.is_final:
        return True
    # terminal: only the named reorgs may follow. A newer snapshot of the same terminal status is no
    # exception: "a terminal event ends the resource's state machine", so one newer than the current
    # (a withdrawal completed again) implies the reorg between them and waits for it
    return w.event_type in REORGS


def _apply(state: State, w: Webhook, d: Delivery, outcome: str) -> Decision:
    resource = w.resource
    # ``data`` as sent: the same bytes are the state's snapshot and the row's (a Fragment is copied
    # into the decision's JSON as it is; the ingest checked them)
    state.snapshot = w.data
    written = bytes(w.data)
    state.applied += 1
    row: PaymosRow = {"id": resource.id, "status": resource.status, "is_final": resource.is_final,
           "updated_at_ms": resource.updated_at, "snapshot": orjson.Fragment(written), "applied_seq": state.applied}
    effects = _effects(state, w.event_type, w, d)
    return decide(d, outcome, row=row, table=TABLE[resource.object], effects=effects,
                  event_id=w.event_id, event_type=w.event_type, payload=w.payload)  # _common's, spelt out: hot


def _common(w: Webhook) -> Common:
    return {"event_id": w.event_id, "event_type": w.event_type, "payload": w.payload}


def _readable(state: State, out: list[Decision]) -> list[tuple[Webhook, Parked]]:
    """The parked bodies, read (each was checked before it was parked); one that no longer reads (a
    state written by another release) leaves the state with a quarantined decision saying why,
    rather than holding its resource's reorgs back for good."""
    found = []
    for p in list(state.parked):
        w = read(bytes(memoryview(p.body)), checked=True)
        if isinstance(w, Webhook):
            found.append((w, p))
        else:
            state.parked.remove(p)
            out.append(decide(p.delivery, QUARANTINED, error=f"a parked body no longer reads: {w.quarantine_reason}"))
    return found


def _retry_parked(state: State) -> list[Decision]:
    """After a change, parked snapshots get another chance, oldest first; older ones turn stale."""
    out: list[Decision] = []
    progressed = True
    while progressed and state.parked:
        progressed = False
        waiting = sorted(_readable(state, out), key=lambda wp: _key(wp[0].resource))
        current = _current(state)
        for w, p in waiting:
            if current is not None and _key(w.resource) <= _key(current):
                state.parked.remove(p)
                out.append(decide(p.delivery, STALE, **_common(w)))
                progressed = True
                break
            if _allowed(current, w):
                state.parked.remove(p)
                out.append(_apply(state, w, p.delivery, UNPARKED))
                progressed = True
                break
    return out


def apply_event(state: State | None, w: Webhook, d: Delivery) -> tuple[State, list[Decision]]:
    state = State() if state is None else state
    resource, event_id, event_type = w.resource, w.event_id, w.event_type
    if event_id in state.seen:
        # a redelivery, not a transition
        return numbered(state, [decide(d, DUPLICATE, event_id=event_id, event_type=event_type, payload=w.payload)])
    state.seen.append(event_id)
    if state.kind not in (None, resource.object):
        return numbered(state, [decide(d, QUARANTINED, error="object kind changed", **_common(w))])
    state.kind = resource.object

    if event_type == "invoice.paid_late":
        # a note beside the terminal decision, never a transition: one per invoice
        if state.noted:
            return numbered(state, [decide(d, DUPLICATE, event_id=event_id, event_type=event_type, payload=w.payload)])
        state.noted = True
        rid = resource.id
        note: dict[str, str] = {
            "note_key": f"paymos:{rid}:paid_late", "resource_id": rid, "kind": "paid_late",
            "body": f"paid in full after closing as {resource.status} (paid_late_at {resource.paid_late_at})"}
        effect = Effect(f"paymos:{rid}:add_order_note", "add_order_note", "paymos", rid,
                        {"invoice_id": rid, "note": note["body"]}, d.delivery_id)
        return numbered(state, [decide(d, APPLIED, facts=[Fact("order_note", note["note_key"], note)],
                                       effects=[effect], **_common(w))])

    current = _current(state)
    if current is not None and _key(resource) <= _key(current):
        return numbered(state, [decide(d, STALE, event_id=event_id, event_type=event_type, payload=w.payload)])
    if not _allowed(current, w):
        if len(state.parked) >= MAX_PARKED:
            state.seen.remove(event_id)  # its own id, appended above: delivered again, it is decided, not a duplicate
            full = f"data.id: {resource.object} {resource.id} holds {MAX_PARKED} parked snapshots, the most one keeps"
            return numbered(state, [decide(d, QUARANTINED, error=full, **_common(w))])
        state.parked.append(Parked(msgspec.Raw(w.raw), d))
        return numbered(state, [decide(d, PARKED, error="change out of a terminal state waits for its reorg",
                                       **_common(w))])
    decisions = [_apply(state, w, d, APPLIED)]
    decisions += _retry_parked(state)
    return numbered(state, decisions)


def snapshot(state: State) -> bytes:
    return _encode(Snapshot(state.kind, state.snapshot, len(state.parked), state.emitted, state.noted))


REDUCER: Reducer[State, Webhook] = Reducer(read, apply_event, load, dump, snapshot, snapshot_type=Snapshot)
