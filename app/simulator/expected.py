"""What the gateways' documents say the read models must hold, computed from the generated
lifecycle alone (pure; nothing here imports app/core, so a wrong reducer there cannot agree with
itself).

- card (gateway-docs/card-gateway-order-playbook.txt): the playbook's reducer over every stored
  event of the payment sorted by ``(sequence | occurred_at, rank)``: partial captures and refunds
  add up, an over-refund or a capture before the authorisation parks until it can apply, and a
  ``synced`` answer of the gateway's GET replaces the working state and totals (later events apply
  on top). With every event delivered and no fetch answered, the reducer alone reaches the
  gateway's final state; a payment whose events cannot all apply ends where the applied ones
  leave it.
- pg (DESIGN §2.1): each deposit or withdrawal ends at the object of its highest ``version``; a
  user's balance is the ``amount_received_minor`` of each deposit whose highest version is settled.
- paymos (DESIGN §2.3): each resource ends at the ``data.status`` of its newest event by
  ``data.updated_at`` (ties in the lifecycle's order, which is the state machine's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from app.simulator.lifecycles import Emitted

CARD_RANK = {"synced": -1, "authorised": 0, "captured": 1, "voided": 1, "refunded": 2}
CARD_NEXT: dict[str, dict[str, str]] = {  # the playbook's transition table, as printed there
    "created": {"authorised": "authorised"},
    "authorised": {"captured": "captured", "voided": "voided"},
    "captured": {"captured": "captured", "refunded": "captured"},
    "refunded": {},
    "voided": {},
}


@dataclass(frozen=True)
class Fetched:
    """One answer of the simulated ``GET /payments/{ref}`` that the fetcher turns into a synced event."""
    ref: str
    answer: dict[str, Any]
    at_ms: int  # wall clock when served: the synced event's occurred_at is a little later


@dataclass
class Expected:
    pg_deposits: dict[str, str] = field(default_factory=dict)
    pg_withdrawals: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    balances: dict[str, int] = field(default_factory=dict)
    card: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # state, captured, refunded
    paymos: dict[str, str] = field(default_factory=dict)


def occurred_ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def card_reduce(bodies: list[dict[str, Any]], fetched: Sequence[Fetched] = ()) -> dict[str, Any]:
    """The playbook's ``reduce`` for one payment: its webhook bodies plus the answers fetched for it.
    Returns the gateway's GET shape (state and totals) and the ids left parked."""
    pending: list[tuple[Any, dict[str, Any]]] = []
    for b in {b["id"]: b for b in bodies}.values():
        kind = str(b["type"]).removeprefix("payment.")
        order = b["sequence"] if all(x.get("sequence") is not None for x in bodies) and not fetched else None
        pending.append(((order if order is not None else occurred_ms(b["occurred_at"]), CARD_RANK[kind], b["id"]),
                        {"id": b["id"], "kind": kind, "amount": b["amount_minor"]}))
    for f in fetched:
        pending.append(((f.at_ms, CARD_RANK["synced"], f"sync_{f.at_ms}"),
                        {"id": f"sync_{f.at_ms}", "kind": "synced", "answer": f.answer}))
    pending.sort(key=lambda p: p[0])
    state, authorised, captured, refunded = "created", 0, 0, 0
    progressed = True
    while progressed and pending:
        progressed = False
        for i, (_, ev) in enumerate(pending):
            if ev["kind"] == "synced":
                a = ev["answer"]
                state, authorised = a["state"], a["authorised_minor"]
                captured, refunded = a["captured_minor"], a["refunded_minor"]
                pending = pending[i + 1:]  # what the gateway reported includes the earlier ones still waiting
                progressed = True
                break
            to = CARD_NEXT[state].get(ev["kind"])
            over = ev["kind"] == "refunded" and refunded + ev["amount"] > captured
            if to is None or over:
                continue  # not yet: stays pending, never dropped
            if ev["kind"] == "authorised":
                authorised = ev["amount"]
            elif ev["kind"] == "captured":
                captured += ev["amount"]
            elif ev["kind"] == "refunded":
                refunded += ev["amount"]
            state = "refunded" if refunded > 0 and refunded == captured else to
            del pending[i]
            progressed = True
            break  # restart from the lowest key after every change
    return {"state": state, "authorised_minor": authorised, "captured_minor": captured,
            "refunded_minor": refunded, "parked": [ev["id"] for _, ev in pending]}


def expected(events: list[Emitted], correlations: dict[str, dict[str, str]], lost: frozenset[bytes] = frozenset(),
             fetched: Sequence[Fetched] = ()) -> Expected:
    """The read models' expected content after ``events`` were delivered (all but the bodies in
    ``lost``, which the gateway gave up on) and the card API answered ``fetched``."""
    out = Expected()
    pg_latest: dict[str, dict[str, Any]] = {}
    card: dict[str, list[dict[str, Any]]] = {}
    paymos_latest: dict[str, tuple[int, int, str]] = {}
    for n, e in enumerate(events):
        if e.body in lost:
            continue
        body = orjson.loads(e.body)
        if e.gateway == "pg":
            obj = body["data"]["object"]
            if obj["id"] not in pg_latest or obj["version"] > pg_latest[obj["id"]]["version"]:
                pg_latest[obj["id"]] = obj
        elif e.gateway == "card":
            card.setdefault(e.resource, []).append(body)
        elif e.gateway == "paymos":
            rid, key = body["data"]["id"], (body["data"]["updated_at"], n, body["data"]["status"])
            paymos_latest[rid] = max(paymos_latest.get(rid, key), key)
    out.balances = {c["our_user_id"]: 0 for c in correlations.values()}
    for rid, obj in pg_latest.items():
        if obj["object"] == "deposit":
            out.pg_deposits[rid] = obj["status"]
            if obj["status"] == "settled":  # a reversed deposit was credited and debited again
                out.balances[correlations[rid]["our_user_id"]] += obj["amount_received_minor"]
        else:
            out.pg_withdrawals[rid] = (obj["status"], obj["filled_minor"], obj["remaining_minor"])
    by_ref: dict[str, list[Fetched]] = {}
    for f in fetched:
        by_ref.setdefault(f.ref, []).append(f)
    for ref, bodies in card.items():
        r = card_reduce(bodies, by_ref.get(ref, []))
        out.card[ref] = (r["state"], r["captured_minor"], r["refunded_minor"])
    out.paymos = {rid: status for rid, (_, _, status) in paymos_latest.items()}
    return out

