"""Adyen's side of `orderly simulate --check`: seeded payment lifecycles as Adyen makes them, their
deliveries on Adyen's retry schedule, and what the read model and the merchant must end at (pure,
seeded; written from Adyen's documents, docs/gateways/adyen.md — nothing here imports app/core).

A lifecycle is made in Adyen's own order, and its truth is kept as it is made: the payment's state
and totals after each item, and the effects each state earned (`mark_order_paid` once something is
captured, `mark_order_refunded` once all of it is refunded, `mark_order_failed` on a refusal,
`open_dispute` on a chargeback or its notice). Refusals, failed modifications (``success:"false"``),
a capture that fails (``CAPTURE_FAILED``) and is captured again, partial refunds that may fail
(``REFUND_FAILED``), cancellations, ``CANCEL_OR_REFUND``, chargebacks and their reversal, and items
sharing one second of ``eventDate`` where the lifecycle's rank keeps their order.

Deliveries: each item is retried at 9, 18 and 27 s, then from Adyen's queue at its documented
intervals (2 min ... 8 h) and every 8 h after that, up to 30 days [R]; outages in a history last at
most 5 days, so every item arrives in the end (Adyen has no API to fetch a payment). A 200 lost on
the way brings the same item again. The records are the items themselves, as the ingest stores them.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson

from app.gateways import adyen as adapter
from app.simulator import lifecycles
from app.simulator.histories import (
    DAY,
    HOUR,
    MIN,
    Delivery,
    Event,
    History,
    Retrying,
    Schedule,
    in_arrival_order,
)
from app.simulator.lifecycles import Emitted
from app.simulator.oracle import Outcome
from app.simulator.plugins import DemoInput, DemoTable, GatewaySimulator

T0_MS = 1_796_000_000_000
KEY = "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF"  # the registry's dev key
# three quick retries, then the queue's intervals, then every 8 h up to 30 days (docs: [R])
_QUEUE = (2 * MIN, 5 * MIN, 10 * MIN, 15 * MIN, 30 * MIN, HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR)
RETRIES: tuple[int, ...] = (0, 9_000, 18_000, 27_000)
for _gap in _QUEUE + (8 * HOUR,) * 90:
    if RETRIES[-1] + _gap > 30 * DAY:
        break
    RETRIES += (RETRIES[-1] + _gap,)
# The lifecycle's order where two items share an eventDate (docs/gateways/adyen.md, Order).
TIE_RANK = {"AUTHORISATION": 0, "CAPTURE": 1, "CANCELLATION": 1, "CANCEL_OR_REFUND": 1, "CAPTURE_FAILED": 2,
            "REFUND": 3, "REFUND_FAILED": 4, "NOTIFICATION_OF_CHARGEBACK": 5, "CHARGEBACK": 6,
            "CHARGEBACK_REVERSED": 7, "SECOND_CHARGEBACK": 8}
DISPUTES = ("NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK", "SECOND_CHARGEBACK")


class Truth:
    """The payment as Adyen holds it, item after item in Adyen's order (the documents' rules)."""

    def __init__(self) -> None:
        self.state, self.authorised, self.before = "created", 0, ""
        self.captures: dict[str, int] = {}
        self.refunds: dict[str, int] = {}
        self.earned: set[str] = set()

    def copy(self) -> Truth:
        twin = Truth()
        twin.state, twin.authorised, twin.before = self.state, self.authorised, self.before
        twin.captures, twin.refunds, twin.earned = dict(self.captures), dict(self.refunds), set(self.earned)
        return twin

    @property
    def captured(self) -> int:
        return sum(self.captures.values())

    @property
    def refunded(self) -> int:
        return sum(self.refunds.values())

    def take(self, code: str, psp: str, amount: int, success: bool) -> None:
        if code == "AUTHORISATION":
            self.state, self.authorised = ("authorised", amount) if success else ("refused", 0)
        elif not success:
            pass  # Adyen did not carry the modification out
        elif code in ("CHARGEBACK", "SECOND_CHARGEBACK"):
            if self.state != "chargeback":
                self.before, self.state = self.state, "chargeback"
        elif code == "CHARGEBACK_REVERSED":
            self.state = self.before
        elif code == "CANCELLATION" or (code == "CANCEL_OR_REFUND" and not self.captured):
            self.state = "cancelled"
        elif code != "NOTIFICATION_OF_CHARGEBACK":
            if code == "CAPTURE":
                self.captures[psp] = amount
            elif code == "CAPTURE_FAILED":
                del self.captures[psp]
            elif code == "REFUND":
                self.refunds[psp] = amount
            elif code == "REFUND_FAILED":
                del self.refunds[psp]
            elif code == "CANCEL_OR_REFUND":
                self.refunds[psp] = self.captured - self.refunded
            self.state = ("authorised" if not self.captured else "refunded" if self.refunded >= self.captured
                          else "captured")
        self.earned |= {"mark_order_paid"} if self.captured else set()
        # refunded only once all that was authorised is (or on CANCEL_OR_REFUND): partial captures
        # may still come, so a refund of what is captured so far is not the order's refund
        whole = self.refunded >= self.authorised or code == "CANCEL_OR_REFUND"
        self.earned |= {"mark_order_refunded"} if self.state == "refunded" and whole else set()
        self.earned |= {"mark_order_failed"} if self.state == "refused" else set()
        self.earned |= {"open_dispute"} if success and code in DISPUTES else set()


def steps(rng: random.Random, amount: int) -> list[tuple[str, str, int, bool]]:
    """(eventCode, the item's own pspReference suffix, value, success) in Adyen's order. A recapture
    is a CAPTURE of the failed one's pspReference with ``"reason": "Transaction Recaptured"`` [F]:
    its suffix ends in ``+``."""
    if rng.random() < 0.12:
        return [("AUTHORISATION", "", amount, False)]
    out = [("AUTHORISATION", "", amount, True)]
    if rng.random() < 0.1:
        out.append(("CAPTURE", "CX", amount, False))  # a capture request Adyen refused
    roll = rng.random()
    if roll < 0.12:
        return [*out, ("CANCELLATION", "CN", amount, True)]
    if roll < 0.2:
        return [*out, ("CANCEL_OR_REFUND", "CR", amount, True)]
    refunded = captured = 0
    parts = 1 if rng.random() < 0.7 else rng.choice([2, 3])  # partial captures, each its own reference
    for c in range(parts):
        value = amount - captured if c == parts - 1 and rng.random() < 0.7 else rng.randrange(1, amount - captured + 1)
        out.append(("CAPTURE", f"C{c}", value, True))
        captured += value
        if rng.random() < 0.15 and captured - value >= refunded:
            out.append(("CAPTURE_FAILED", f"C{c}", value, True))
            if rng.random() < 0.4:
                return out
            out.append(("CAPTURE", f"C{c}+", value, True))  # "Transaction Recaptured"
        refunded, failed = _refunds(rng, out, c, captured, refunded)
        if failed or captured == amount:
            break
    if rng.random() < 0.1:
        return [*out, ("CANCEL_OR_REFUND", "CR", amount, True)]
    if refunded < captured and rng.random() < 0.2:
        if rng.random() < 0.5:
            out.append(("NOTIFICATION_OF_CHARGEBACK", "D1", captured, True))
        out.append(("CHARGEBACK", "D1", captured - refunded, True))
        if rng.random() < 0.4:
            out.append(("CHARGEBACK_REVERSED", "D1", captured - refunded, True))
            if rng.random() < 0.4:
                out.append(("SECOND_CHARGEBACK", "D1", captured - refunded, True))
    return out


def _refunds(rng: random.Random, out: list[tuple[str, str, int, bool]], c: int, captured: int,
             refunded: int) -> tuple[int, bool]:
    """Up to three partial refunds of what is captured so far (some refused, some failing): the new
    total, and whether one failed (no refund after it: docs/gateways/adyen.md, Limits)."""
    for n in range(rng.choice([0, 0, 1, 2, 3])):
        value = captured - refunded if rng.random() < 0.4 else rng.randrange(1, captured + 1)
        if refunded + value > captured or value == 0:
            out.append(("REFUND", f"RX{c}{n}", max(value, 1), False))  # above what is left: refused
            continue
        out.append(("REFUND", f"R{c}{n}", value, True))
        refunded += value
        if rng.random() < 0.15:
            out.append(("REFUND_FAILED", f"R{c}{n}", value, True))
            return refunded - value, True
    return refunded, False


def event_date(ms: int, zone: timezone, millis: bool) -> str:
    """ISO 8601 with an offset, as Adyen writes ``eventDate`` (seconds, or milliseconds)."""
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone(zone).isoformat(
        timespec="milliseconds" if millis else "seconds")


def payment(rng: random.Random, stem: str) -> tuple[str, list[tuple[dict[str, Any], int, Truth]]]:
    """One payment's items in Adyen's order: (item, eventDate in ms, the truth after it)."""
    psp, amount = f"PSP{stem}", rng.randrange(100, 100_000)
    zone = timezone(timedelta(hours=rng.choice([0, 1, 2, -5])))
    millis = rng.random() < 0.3
    clock, truth, made = T0_MS + rng.randrange(0, 60) * 1000, Truth(), []
    previous = ""
    for code, suffix, value, success in steps(rng, amount):
        tie = previous and TIE_RANK[code] > TIE_RANK[previous] and rng.random() < 0.3
        clock += 0 if tie else rng.choice([1, 2, 60, 3600, 86_400]) * 1000 + (rng.randrange(1000) if millis else 0)
        previous, own = code, psp if code == "AUTHORISATION" else f"{psp}{suffix.rstrip('+')}"
        truth.take(code, own, value, success)
        item: dict[str, Any] = {
            "pspReference": own, "eventCode": code, "success": "true" if success else "false",
            "eventDate": event_date(clock, zone, millis), "amount": {"value": value, "currency": "EUR"},
            "merchantAccountCode": "SimShop", "merchantReference": f"order-{stem}"}
        if code != "AUTHORISATION":
            item["originalReference"] = psp
        if suffix.endswith("+"):
            item["reason"] = "Transaction Recaptured"
        made.append((item, clock, truth.copy()))
    return psp, made


def history(rng: random.Random, seed: int, stem: str) -> History:
    """One payment's lifecycle and its deliveries (``stem`` names its references)."""
    psp, made = payment(rng, stem)
    events = []
    for n, (item, clock, truth) in enumerate(made):
        item["additionalData"] = {"hmacSignature": adapter.sign_item(item, KEY)}
        events.append(Event(psp, orjson.dumps(item), clock, {
            "n": n, "state": truth.state, "authorised_minor": truth.authorised, "captured_minor": truth.captured,
            "refunded_minor": truth.refunded, "earned": sorted(truth.earned)}))
    schedule = Schedule.draw(rng, T0_MS, Retrying(RETRIES))
    deliveries = []
    for index, event in enumerate(events):
        deliveries += [Delivery("webhook", psp, event.body, at, index) for at in _arrivals(rng, event, schedule)]
    return History("adyen", seed, events, in_arrival_order(rng, deliveries))


def requests(rng: random.Random, count: int, truths: dict[str, dict[str, Any]]) -> list[tuple[str, bytes, int]]:
    """`orderly simulate`'s Adyen: ``count`` payments as (payment, unsigned request body, created ms);
    a request holds one item, or now and then two of a payment made in the same second (Adyen's
    older batched deliveries). The deliverer signs each item (app/simulator/deliver.py). ``truths``
    gets each payment's final row and effects."""
    out = []
    for i in range(count):
        psp, made = payment(rng, f"SIM{i}")
        pending: list[dict[str, Any]] = []
        for n, (item, clock, _) in enumerate(made):
            pending.append(item)
            if n + 1 < len(made) and made[n + 1][1] == clock and rng.random() < 0.5:
                continue  # the next item goes in the same request
            out.append((psp, orjson.dumps({"live": "false", "notificationItems": [
                {"NotificationRequestItem": p} for p in pending]}), clock))
            pending = []
        last = made[-1][2]
        truths[psp] = {"state": last.state, "authorised_minor": last.authorised, "captured_minor": last.captured,
                       "refunded_minor": last.refunded, "effects": sorted(last.earned)}
    return out


def _arrivals(rng: random.Random, event: Event, schedule: Schedule) -> list[int]:
    """When ``event`` reaches the log: the first attempt the endpoint takes (Adyen never gives up
    within 30 days, longer than any outage here), and again when the 200 was lost."""
    first = event.created_ms + rng.choice([0, 5, 40, 300, 1500])
    for offset in RETRIES:
        at = first + offset + (rng.randrange(0, 2_000) if offset else 0)
        if schedule.down(at) or (rng.random() < schedule.fail and offset != RETRIES[-1]):
            continue
        arrived = [at]
        while rng.random() < schedule.duplicate:
            arrived.append(arrived[-1] + rng.choice([1, 200, 9_000, 10 * MIN]))
        return arrived
    return [first + RETRIES[-1]]  # not reached: the last attempt always lands after any outage


def expected(history: History) -> dict[str, Any]:
    """What the read model, the merchant and the parked listing must show at the end: the truth
    after the last item (every item arrives), the effects every state on the way earned, nothing
    parked. Keyword arguments of app/simulator/oracle.Outcome."""
    last, psp = history.events[-1].fact, history.events[0].resource
    row = {k: last[k] for k in ("state", "authorised_minor", "captured_minor", "refunded_minor")}
    effects = {(f"adyen:{psp}:{kind}", kind, None) for kind in last["earned"]}
    return {"rows": {psp: row}, "effects": effects, "parked": {psp: 0}}


# --- `orderly demo` -------------------------------------------------------------------------------
DEMO_GAP_MS = 20_000  # the demo's sending clock: an item at most this long after the previous one


def demo(rng: random.Random, count: int, truth: lifecycles.Truth) -> list[Emitted]:
    """`orderly demo`'s Adyen: the requests of ``count`` payments, sent on a compressed clock (a day
    between two items of the lifecycle would be 36 minutes of the demo); each item keeps its own
    ``eventDate``, which is what orders it (the sending time is only when it leaves)."""
    sent: dict[str, int] = {}
    made: dict[str, int] = {}
    out = []
    for psp, body, clock in requests(rng, count, truth.by_gateway.setdefault("adyen", {})):
        at = (T0_MS + (clock - T0_MS) % 60_000 if psp not in sent
              else sent[psp] + min(clock - made[psp], DEMO_GAP_MS))
        sent[psp], made[psp] = at, clock
        out.append(Emitted("adyen", psp, body, at))
    return sorted(out, key=lambda e: e.created_ms)


def _applies(t: Truth, code: str, psp: str, value: int, success: bool) -> bool:
    """docs/gateways/adyen.md, Decisions: whether an item can apply to the payment ``t`` now (else it
    stays parked); a refused modification applies and changes nothing."""
    if code == "AUTHORISATION" or t.state == "created":
        return code == "AUTHORISATION"
    if not success:
        return True
    if t.state == "cancelled":
        return code in ("CANCELLATION", "CANCEL_OR_REFUND")  # a repeat: no change
    if code == "CAPTURE":  # partial captures may follow a refund; never past what was authorised
        return t.captured + value <= t.authorised
    if code == "CAPTURE_FAILED":  # not while what stays captured would be below what is refunded
        return psp in t.captures and t.captured - t.captures[psp] >= t.refunded
    if code == "REFUND":
        return 0 < t.captured and t.refunded + value <= t.captured
    if code == "REFUND_FAILED":
        return psp in t.refunds
    if code == "CANCELLATION":
        return t.state == "authorised" and not t.captured
    if code == "CANCEL_OR_REFUND":
        return t.state in ("authorised", "captured")
    if code == "CHARGEBACK_REVERSED":
        return t.state == "chargeback"
    return True  # a dispute item: after the authorisation


def _instant_ms(event_date: str) -> int:
    return int(datetime.fromisoformat(event_date).timestamp() * 1000)


def expected_payments(run: DemoInput) -> dict[str, tuple[str, int, int, int]]:
    """What docs/gateways/adyen.md says ``adyen_payments`` holds after the delivered items: each
    payment's items sorted by (``eventDate`` as an instant, the lifecycle rank, the dedupe key),
    the lowest one that can apply applied, again and again; the others stay parked. A payment
    whose authorisation never came has no row. (state, authorised, captured, refunded)."""
    items: dict[str, dict[str, dict[str, Any]]] = {}
    for e in run.events:
        for wrapped in orjson.loads(e.body)["notificationItems"]:
            item = wrapped["NotificationRequestItem"]
            # the dedupe key of the signed fields, a recapture told apart by Adyen's reason [F]
            key = (f"{item['pspReference']}:{item['eventCode']}:{item['success']}:{item['amount']['value']}:"
                   f"{item['amount']['currency']}:{'recaptured' in (item.get('reason') or '').lower()}")
            items.setdefault(item.get("originalReference") or item["pspReference"], {})[key] = item
    out = {}
    for psp, by_key in items.items():
        pending = sorted(by_key.items(), key=lambda kv: (_instant_ms(kv[1]["eventDate"]),
                                                         TIE_RANK[kv[1]["eventCode"]], kv[0]))
        t, authorised = Truth(), False
        while True:
            for n, (_, item) in enumerate(pending):
                code, own, value = item["eventCode"], item["pspReference"], item["amount"]["value"]
                success = item["success"] == "true"
                if _applies(t, code, own, value, success):
                    if not (code == "AUTHORISATION" and authorised):  # a second one changes nothing
                        t.take(code, own, value, success)
                    authorised = True
                    del pending[n]
                    break
            else:
                break
        if authorised:
            out[psp] = (t.state, t.authorised, t.captured, t.refunded)
    return out


DEMO_TABLES = (
    DemoTable("adyen payments",
              "SELECT psp_reference, state, authorised_minor, captured_minor, refunded_minor FROM adyen_payments",
              expected_payments,
              lambda truth: {psp: (r["state"], r["authorised_minor"], r["captured_minor"], r["refunded_minor"])
                             for psp, r in truth.by_gateway.get("adyen", {}).items()}),
)


# What the simulator knows of adyen (app/simulator/plugins.py): the registry line names this module.
# Live retries in Adyen's own seconds: three 9 s apart, then its queue at 2, 5, 10, 15, 30 min, ...
SIMULATOR = GatewaySimulator(
    history, lambda h: Outcome(**expected(h)),
    rows={"adyen_payments": ("state", "authorised_minor", "captured_minor", "refunded_minor")},
    lifecycles=lambda rng, count, truth: [Emitted("adyen", *r) for r in requests(
        rng, count, truth.by_gateway.setdefault("adyen", {}))],
    demo=lambda rng, n, truth: demo(rng, n[0], truth), demo_sizes=(150,), demo_tables=DEMO_TABLES,
    retry_s=(9.0, 9.0, 9.0, 120.0, 300.0, 600.0, 900.0, 1800.0))
