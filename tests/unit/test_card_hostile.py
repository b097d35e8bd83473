"""The card reducer under a sender that never stops: a payment keeps at most MAX_EVENTS events, so
what one delivery costs (every event sorted and reduced again) stays bounded; the rest are
quarantined, naming the field."""

from __future__ import annotations

import orjson

from app.core import card as core
from app.core.model import APPLIED, DUPLICATE, PARKED, QUARANTINED, Decision, Delivery
from app.gateways.card import Webhook, read


def delivery(n: int) -> Delivery:
    return Delivery(f"dlv_{n}", "card", "card:pay_1", 1_700_000_000_000 + n, n)


def body(n: int, kind: str, amount: int) -> Webhook:
    raw = orjson.dumps({"id": f"evt_{n}", "type": f"payment.{kind}", "payment_ref": "pay_1",
                        "occurred_at": f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}Z", "amount_minor": amount,
                        "sequence": n})
    webhook = read(raw, True)
    assert isinstance(webhook, Webhook), webhook
    return webhook


def test_a_payment_keeps_at_most_max_events_events_and_quarantines_the_rest_naming_the_field() -> None:
    state, first = core.apply_event(None, body(1, "authorised", 10_000), delivery(1))
    assert [d.outcome for d in first] == [APPLIED]
    decisions: list[Decision] = []
    for n in range(2, core.MAX_EVENTS + 21):  # refunds over what is captured: every one parked
        state, made = core.apply_event(state, body(n, "refunded", 1), delivery(n))
        decisions += made
    assert len(state.events) == core.MAX_EVENTS
    assert [d.outcome for d in decisions] == [PARKED] * (core.MAX_EVENTS - 1) + [QUARANTINED] * 20
    quarantined = decisions[-1]
    assert quarantined.error == f"payment_ref: payment pay_1 holds {core.MAX_EVENTS} events, the most one payment keeps"
    assert (quarantined.event_id, quarantined.event_type, quarantined.sequence, quarantined.row,
            quarantined.effects, quarantined.facts) == (
        f"evt_{core.MAX_EVENTS + 20}", "payment.refunded", core.MAX_EVENTS + 20, None, [], [])
    assert quarantined.delivery_id == f"dlv_{core.MAX_EVENTS + 20}" and quarantined.outcome == QUARANTINED
    assert orjson.loads(orjson.dumps(quarantined.payload))["id"] == f"evt_{core.MAX_EVENTS + 20}"
    assert len(core.dump(state)) < 1024 * 1024  # far below a record's limit
    # a repeat of a kept event is still a duplicate, not quarantined
    state, again = core.apply_event(state, body(5, "refunded", 1), delivery(5))
    assert [d.outcome for d in again] == [DUPLICATE]

