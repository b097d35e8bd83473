"""What the gateways' documents say the read models must hold, computed from the generated
lifecycle alone (pure; nothing here imports app/core, so a wrong reducer there cannot agree with
itself). Each gateway's expected read models are its simulator module's ``demo_tables``
(app/simulator/plugins.py); what they share is here (card's playbook reducer serves its simulated
GET API too).

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
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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
