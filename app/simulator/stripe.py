"""Seeded Stripe PaymentIntent lifecycles with Stripe's truth, written from Stripe's documents
(pure: no network; docs/gateways/stripe.md).

A lifecycle: the PaymentIntent is created; zero to two attempts fail (the PaymentIntent returns to
``requires_payment_method``, each attempt's charge fails); then it succeeds (automatic or manual
capture), is canceled, or stays open; after success, refunds (partial, full, some failing) and a
dispute (the card network's or an early warning). Events come in creation order, several in one
second where Stripe's own flow makes them together; the truth is what the API would answer at the
end, and the effects Orderly owes the merchant for it (the oracle).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

T0_S = 1_796_000_000
CLOSED_DISPUTE = frozenset({"won", "lost", "warning_closed", "prevented"})


@dataclass
class Truth:
    """The PaymentIntent's row at the end and the effects it earned (dedupe keys)."""

    row: dict[str, Any]
    effects: set[str] = field(default_factory=set)


@dataclass
class Lifecycle:
    resource: str
    events: list[bytes]  # in creation order
    created: list[int]  # each event's created second
    truth: Truth
    # what GET /v1/payment_intents/{id} (latest_charge expanded) and GET /v1/refunds?payment_intent=
    # answer after each event: (PaymentIntent, charge or None, refunds)
    answers: list[tuple[dict[str, Any], dict[str, Any] | None, list[dict[str, Any]]]] = field(default_factory=list)
    ties: list[int] = field(default_factory=list)  # indices of events a same-second tie leaves uncertain


class _Run:
    """The clock, the objects' current state and the events emitted so far."""

    def __init__(self, rng: random.Random, pi: str, t0: int, amount: int, currency: str) -> None:
        self.rng, self.pi, self.clock = rng, pi, t0
        self.events: list[bytes] = []
        self.created: list[int] = []
        self.answers: list[tuple[dict[str, Any], dict[str, Any] | None, list[dict[str, Any]]]] = []
        self.intent: dict[str, Any] = {"id": pi, "object": "payment_intent", "status": "requires_payment_method",
                                       "amount": amount, "amount_received": 0, "currency": currency,
                                       "latest_charge": None}
        self.charge: dict[str, Any] = {}
        self.refunds: dict[str, dict[str, Any]] = {}
        self.dispute: dict[str, Any] = {}
        self.dispute_closed = False
        self.ties: list[int] = []  # events tied with the previous failure in its second

    def tick(self, at_least: int = 0) -> None:
        # Stripe makes several changes within one second (a charge and its PaymentIntent's success)
        self.clock += max(at_least, self.rng.choice([0, 0, 1, 1, 2, 30]))

    def emit(self, event_type: str, obj: dict[str, Any]) -> None:
        event_id = "evt_" + "".join(self.rng.choices("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijkl", k=24))
        self.events.append(orjson.dumps({"id": event_id, "object": "event", "type": event_type, "created": self.clock,
                                         "api_version": "2025-06-30.basil", "livemode": False,
                                         "data": {"object": dict(obj)}}))
        self.created.append(self.clock)
        self.answers.append((dict(self.intent), dict(self.charge) if self.charge else None,
                             [dict(r) for r in self.refunds.values()]))

    def intent_event(self, event_type: str, status: str, at_least: int = 0) -> None:
        self.tick(at_least)
        self.intent["status"] = status
        self.emit(event_type, self.intent)

    def new_charge(self, n: int, status: str, captured: bool) -> None:
        amount = self.intent["amount"]
        self.charge = {"id": f"ch_{self.pi}_{n}", "object": "charge", "status": status, "amount": amount,
                       "amount_captured": amount if status == "succeeded" and captured else 0,
                       "amount_refunded": 0, "captured": captured, "refunded": False,
                       "currency": self.intent["currency"], "payment_intent": self.pi}
        self.intent["latest_charge"] = self.charge["id"]
        self.emit("charge.succeeded" if status == "succeeded" else "charge.failed", self.charge)


def lifecycle(rng: random.Random, pi: str, t0: int = T0_S) -> Lifecycle:
    run = _Run(rng, pi, t0, rng.randrange(50, 500_000), rng.choice(["eur", "usd", "jpy"]))
    run.emit("payment_intent.created", run.intent)
    failures = rng.choice([0, 0, 1, 2])
    for n in range(failures):  # failed attempts: back to requires_payment_method
        retry(run, rng, tied=n > 0 and rng.random() < 0.2)
        if rng.random() < 0.4:
            run.intent_event("payment_intent.processing", "processing")  # a decline can come within its second
        run.tick()
        run.new_charge(n, "failed", False)
        run.intent_event("payment_intent.payment_failed", "requires_payment_method")
    end = rng.random()
    if end < 0.65:
        succeed(run, rng)
    elif end < 0.85:
        run.intent_event("payment_intent.canceled", "canceled", at_least=1)
    elif failures and rng.random() < 0.5:  # a new attempt still processing at the end (a bank debit takes days)
        retry(run, rng, tied=rng.random() < 0.5, step=("payment_intent.processing", "processing"))
    return Lifecycle(pi, run.events, run.created, truth(run), run.answers, run.ties)


def retry(run: _Run, rng: random.Random, tied: bool,
          step: tuple[str, str] = ("payment_intent.requires_action", "requires_action")) -> None:
    """An attempt's first step: after the previous failure's second, or (``tied``) within it —
    the same-second tie the rank cannot place, which asks for a fetch (docs/gateways/stripe.md)."""
    if tied:
        run.intent["status"] = step[1]
        run.ties.append(len(run.events))
        run.emit(step[0], run.intent)
        return
    run.tick(1)
    if step[1] != "requires_action" or rng.random() < 0.3:
        run.intent_event(*step)


def succeed(run: _Run, rng: random.Random) -> None:
    manual = rng.random() < 0.3
    run.tick(1)  # a retry's attempt starts after the failure's second: docs/gateways/stripe.md, uncertain ties
    if rng.random() < 0.3:
        run.intent_event("payment_intent.processing", "processing")
    run.new_charge(9, "succeeded", not manual)
    if manual:
        run.intent_event("payment_intent.amount_capturable_updated", "requires_capture")
        run.tick(1)
        run.charge.update(captured=True, amount_captured=run.charge["amount"])
        run.emit("charge.captured", run.charge)
    run.intent["amount_received"] = run.intent["amount"]
    run.intent_event("payment_intent.succeeded", "succeeded")
    for n in range(rng.choice([0, 0, 1, 2])):
        refund(run, rng, n)
    if rng.random() < 0.25:
        dispute(run, rng)


def refund(run: _Run, rng: random.Random, n: int) -> None:
    alive = sum(r["amount"] for r in run.refunds.values() if r["status"] in ("pending", "succeeded"))
    left = run.charge["amount"] - alive
    if left <= 0:
        return
    amount = left if rng.random() < 0.5 else max(1, left // 2)
    r = {"id": f"re_{run.pi}_{n}", "object": "refund", "status": "pending", "amount": amount,
         "charge": run.charge["id"], "payment_intent": run.pi, "currency": run.charge["currency"]}
    run.refunds[r["id"]] = r
    run.tick(1)
    run.charge.update(amount_refunded=alive + amount, refunded=alive + amount == run.charge["amount"])
    run.emit("refund.created", r)  # Stripe changes the charge with its refund: a fetch sees both or neither
    run.emit("charge.refunded", run.charge)
    outcome = rng.random()
    if outcome < 0.15:
        return  # still pending at the end
    run.tick(1)
    if outcome < 0.35:  # a failed refund gives the money back: the charge's amount_refunded drops
        r["status"] = "failed"
        run.charge.update(amount_refunded=alive, refunded=False)
        run.emit("refund.failed", r)
    else:
        r["status"] = "succeeded"
        run.emit("refund.updated", r)


def dispute(run: _Run, rng: random.Random) -> None:
    warning = rng.random() < 0.3
    path = (["warning_needs_response", "warning_under_review", "warning_closed"] if warning else
            ["needs_response", "under_review", rng.choice(["won", "lost"])])
    d = {"id": f"dp_{run.pi}", "object": "dispute", "status": path[0], "amount": run.charge["amount"],
         "charge": run.charge["id"], "payment_intent": run.pi, "currency": run.charge["currency"]}
    run.dispute = d
    run.tick(1)
    run.emit("charge.dispute.created", d)
    if not warning:
        run.emit("charge.dispute.funds_withdrawn", d)  # with the dispute, in its second
    steps = path[1:rng.choice([1, 2, 3])]
    if steps and steps[-1] == "lost" and rng.random() < 0.4:  # an appeal reopens a lost dispute
        steps += ["appeal_needs_response", "appeal_under_review", rng.choice(["won", "lost"])][:rng.choice([1, 2, 3])]
    for status in steps:
        run.tick(1)  # evidence is submitted, then decided: never within the second before
        d["status"] = status
        run.emit("charge.dispute.closed" if status in CLOSED_DISPUTE else "charge.dispute.updated", d)
        if status == "won":
            run.emit("charge.dispute.funds_reinstated", d)
    run.dispute_closed = any(status in CLOSED_DISPUTE for status in steps)


def truth(run: _Run) -> Truth:
    """What Stripe's API says at the end, and what each document rule owes the merchant for it."""
    pi, rid = run.intent, run.pi
    refunds = list(run.refunds.values())
    counted = sum(r["amount"] for r in refunds if r["status"] in ("pending", "succeeded"))
    row = {"id": rid, "status": pi["status"], "amount_minor": pi["amount"],
           "amount_received_minor": pi["amount_received"], "amount_refunded_minor": counted,
           "currency": pi["currency"], "dispute_status": run.dispute.get("status"),
           "updated_at": datetime.fromtimestamp(run.clock, UTC).isoformat().replace("+00:00", "Z")}
    effects = set()
    if pi["status"] == "succeeded":
        effects.add(f"stripe:{rid}:mark_order_paid")
        if sum(r["amount"] for r in refunds if r["status"] == "succeeded") >= pi["amount_received"]:
            effects.add(f"stripe:{rid}:mark_order_refunded")
    if pi["status"] == "canceled":  # a failed attempt is retried; only cancellation fails the order
        effects.add(f"stripe:{rid}:mark_order_failed")
    if run.dispute:
        effects.add(f"stripe:{rid}:open_dispute:{run.dispute['id']}")
        if run.dispute_closed:  # closed once, even if an appeal reopened it
            effects.add(f"stripe:{rid}:close_dispute:{run.dispute['id']}")
    return Truth(row, effects)


def emitted(rng: random.Random, count: int, answers: dict[str, Any] | None = None) -> list[tuple[str, bytes, int]]:
    """(resource, body, created ms) of ``count`` PaymentIntents' events in creation order, for
    `orderly simulate` (its SIMULATOR's lifecycles, app/simulator/stripe_history.py); ``answers``
    receives each PaymentIntent's API answers (what its simulated GET API serves)."""
    out = []
    for i in range(count):
        life = lifecycle(rng, f"pi_sim{i}", T0_S + rng.randrange(0, 60))
        if answers is not None:
            answers[life.resource] = life.answers
        out += [(life.resource, raw, second * 1000) for raw, second in zip(life.events, life.created, strict=True)]
    return out
