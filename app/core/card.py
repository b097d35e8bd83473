"""The card gateway's reducer: payment state and totals from *all* stored events, sorted by the
gateway's order (pure layer; gateway-docs/card-gateway-order-playbook.txt).

Ordering key, stated here in code as the playbook asks:
- ``sequence`` when every event of the payment carries one;
- otherwise ``(occurred_at, rank)``: an authorisation and its auto-capture can share a timestamp,
  so the rank keeps authorised < captured < refunded, and voided after authorised;
- the event id last, so the order is total and a replay sorts identically.

The reducer restarts from the lowest key after every applied event; an event that cannot apply yet
(capture before authorisation, a refund above what is captured) stays parked, never dropped. Totals
are derived from the applied events on every run, never incremented. A ``synced`` event (the
gateway's GET answer) replaces the working state and totals; later events apply on top.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import orjson

from app.core.model import (
    APPLIED,
    DUPLICATE,
    PARKED,
    QUARANTINED,
    SYNCED,
    UNPARKED,
    Decision,
    Delivery,
    Effect,
    Fact,
    numbered,
)
from app.core.model import decide as _decide

STATES = ("created", "authorised", "captured", "refunded", "voided")
RANK = {"authorised": 0, "captured": 1, "voided": 1, "refunded": 2, "synced": -1}
NEXT: dict[str, dict[str, str]] = {
    "created": {"authorised": "authorised"},
    "authorised": {"captured": "captured", "voided": "voided"},
    "captured": {"captured": "captured", "refunded": "captured"},
    "refunded": {},
    "voided": {},
}


@dataclass(frozen=True)
class CardEvent:
    id: str
    kind: str  # authorised | captured | refunded | voided | synced
    occurred_at_ms: int
    amount_minor: int = 0
    sequence: int | None = None
    synced: dict[str, Any] | None = None  # for kind == "synced": state and totals as fetched


@dataclass
class Reduced:
    state: str = "created"
    authorised_minor: int = 0
    captured_minor: int = 0
    refunded_minor: int = 0
    applied: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)


def parse_time_ms(value: str) -> int:
    """ISO-8601 with optional sub-second digits and a Z: milliseconds since the epoch."""
    return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


def event_from_body(body: dict[str, Any]) -> CardEvent:
    kind = str(body["type"]).removeprefix("payment.")
    amount = body.get("amount_minor", 0)
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
        raise ValueError(f"amount_minor must be a non-negative integer, got {amount!r}")
    sequence = body.get("sequence")
    if sequence is not None and (not isinstance(sequence, int) or isinstance(sequence, bool)):
        raise ValueError(f"sequence must be an integer or null, got {sequence!r}")
    return CardEvent(str(body["id"]), kind, parse_time_ms(str(body["occurred_at"])), amount, sequence,
                     body.get("synced"))


def ordering_key(events: list[CardEvent]) -> Any:
    """The sort key for this payment's events (see the module docstring)."""
    if events and all(e.sequence is not None for e in events):
        return lambda e: (e.sequence, RANK.get(e.kind, 3), e.id)
    return lambda e: (e.occurred_at_ms, RANK.get(e.kind, 3), e.id)


def reduce(events: list[CardEvent]) -> Reduced:
    """The playbook's reducer, extended with synced events."""
    unique = list({e.id: e for e in events}.values())  # a redelivered event id is one event
    key = ordering_key(unique)
    pending = sorted(unique, key=key)
    out = Reduced()
    progressed = True
    while progressed and pending:
        progressed = False
        for ev in pending:
            if ev.kind == "synced" and ev.synced is not None:
                s = ev.synced
                out.state = s["state"] if s.get("state") in STATES else out.state
                out.authorised_minor = int(s.get("authorised_minor", 0))
                out.captured_minor = int(s.get("captured_minor", 0))
                out.refunded_minor = int(s.get("refunded_minor", 0))
                # what the gateway reported already includes every earlier event still waiting here
                covered = [p for p in pending if key(p) < key(ev)]
                out.applied += [p.id for p in covered]
                pending = [p for p in pending if p not in covered]
            else:
                to = NEXT[out.state].get(ev.kind)
                over = ev.kind == "refunded" and out.refunded_minor + ev.amount_minor > out.captured_minor
                if to is None or over:
                    continue  # not yet: stays pending, never dropped
                if ev.kind == "authorised":
                    out.authorised_minor = ev.amount_minor
                elif ev.kind == "captured":
                    out.captured_minor += ev.amount_minor
                elif ev.kind == "refunded":
                    out.refunded_minor += ev.amount_minor
                fully_refunded = out.refunded_minor > 0 and out.refunded_minor == out.captured_minor
                out.state = "refunded" if fully_refunded else to
            out.applied.append(ev.id)
            pending = [p for p in pending if p.id != ev.id]
            progressed = True
            break  # restart from the lowest key after every change
    out.parked = [p.id for p in pending]
    return out


def effects_due(reduced: Reduced, emitted: set[str]) -> list[str]:
    """One-shot business effects the payment has now earned and not yet emitted (resource-bound)."""
    due = []
    if reduced.state in ("captured", "refunded") and reduced.captured_minor > 0:
        due.append("mark_order_paid")
    if reduced.state == "refunded":
        due.append("mark_order_refunded")
    if reduced.state == "voided":
        due.append("release_authorisation")
    return [d for d in due if d not in emitted]


# --- decisions for one delivery ---------------------------------------------------------------

State = dict[str, Any]


def _iso(ms: int) -> str:
    from datetime import UTC

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def apply_event(state: State | None, raw: bytes, d: Delivery) -> tuple[State, list[Decision]]:
    """Store the event with the payment's others, rerun the reducer, and decide what changed."""
    state = {"n": 0, "events": [], "emitted": [], "applied": [], "currency": None} if state is None else state
    try:
        body = orjson.loads(raw)
        event = event_from_body(body)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        return numbered(state, [_decide(d, QUARANTINED, error=f"unusable card event: {exc}")])
    common = {"event_id": event.id, "event_type": str(body.get("type")), "sequence": event.sequence,
              "payload": body}
    if any(e["id"] == event.id for e in state["events"]):
        return numbered(state, [_decide(d, DUPLICATE, **common)])
    state["events"].append({**asdict(event), "delivery_id": d.delivery_id, "received_at_ms": d.received_at_ms,
                            "source": d.source})
    state["currency"] = body.get("currency") or state["currency"]
    reduced = reduce([CardEvent(**{k: e[k] for k in ("id", "kind", "occurred_at_ms", "amount_minor", "sequence",
                                                      "synced")}) for e in state["events"]])
    before = set(state["applied"])
    state["applied"] = reduced.applied
    newly = [e for e in state["events"] if e["id"] in reduced.applied and e["id"] not in before]
    row = {"payment_ref": d.resource_key.partition(":")[2], "state": reduced.state,
           "authorised_minor": reduced.authorised_minor, "captured_minor": reduced.captured_minor,
           "refunded_minor": reduced.refunded_minor, "currency": state["currency"],
           "version": len(state["events"])}  # events only accumulate: a newer row has more
    facts = [Fact("card_event", event.id, {
        "gateway_event_id": event.id, "payment_ref": row["payment_ref"], "event_type": str(body.get("type")),
        "sequence": event.sequence, "occurred_at": _iso(event.occurred_at_ms), "received_at": _iso(d.received_at_ms),
        "payload": raw.decode(), "source": "fetch" if event.kind == "synced" else "webhook"})]
    facts += [Fact("card_event_applied", e["id"], {"gateway_event_id": e["id"], "applied_at": _iso(d.received_at_ms)})
              for e in newly]
    effects = [Effect(f"card:{row['payment_ref']}:{kind}", kind, "card", row["payment_ref"],
                      {"payment_ref": row["payment_ref"], "state": reduced.state,
                       "captured_minor": reduced.captured_minor, "refunded_minor": reduced.refunded_minor},
                      d.delivery_id)
               for kind in effects_due(reduced, set(state["emitted"]))]
    state["emitted"] += [e.type for e in effects]
    outcome = SYNCED if event.kind == "synced" else APPLIED if event.id in reduced.applied else PARKED
    decisions = [_decide(d, outcome, row=row if newly else None, table="card_payments" if newly else None,
                         effects=effects, facts=facts, **common)]
    # events that were parked and apply now: their own deliveries move to "unparked"
    for e in newly:
        if e["id"] != event.id:
            original = Delivery(e["delivery_id"], "card", d.resource_key, e["received_at_ms"], d.seq, e["source"])
            decisions.append(_decide(original, UNPARKED, event_id=e["id"], event_type=f"payment.{e['kind']}",
                                     sequence=e["sequence"]))
    return numbered(state, decisions)


def snapshot(state: State) -> dict[str, Any]:
    return {"applied": state["applied"], "events": len(state["events"]), "emitted": state["emitted"],
            "parked": len(state["events"]) - len(state["applied"])}
