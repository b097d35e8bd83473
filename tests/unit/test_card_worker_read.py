"""The worker's one read of a card record accepts what the ingest accepted and what the fetcher
wrote: a webhook carrying a ``synced`` field of its own, and a ``synced`` answer whose derived id
is longer than a webhook's ids may be (regressions of the typed read, issue #43's review)."""

from __future__ import annotations

import orjson
import pytest

from app.core.dispatch import plan_batch
from app.gateways import card as card_adapter
from app.gateways.card import synced_event
from app.gateways.registry import GATEWAYS
from tests.unit.test_dispatch import N, numbered, outputs, webhook


def captured(ref: str, event_id: str, **extra: object) -> bytes:
    return orjson.dumps({"id": event_id, "type": "payment.authorised", "payment_ref": ref, "sequence": None,
                         "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 500, "currency": "EUR",
                         **extra})


@pytest.mark.parametrize("checked", [True, False])
@pytest.mark.parametrize("value", [True, "yes", {"state": "captured"}, [1, 2]])
def test_a_webhook_with_a_synced_field_of_its_own_is_decided_and_stored_as_it_came(checked: bool,
                                                                                   value: object) -> None:
    body = captured("pay_s", "evt_s1", synced=value)
    assert card_adapter.route(body).resource_key == "card:pay_s"  # the ingest takes it
    plan = plan_batch(N, GATEWAYS, numbered([webhook("card", "pay_s", body, "d1", checked)]), lambda p, k: None)
    assert plan.set_aside == []
    assert [d["outcome"] for _, d in outputs(plan, N.decisions)] == ["applied"]
    state = orjson.loads(plan.states[b"card:pay_s"])
    assert state["events"][0]["synced"] == value  # kept as the document held it, as the state always did
    again = plan_batch(N, GATEWAYS, numbered([webhook("card", "pay_s", body, "d2", checked)]),
                       lambda p, k: plan.states[b"card:pay_s"])  # the stored state loads again
    assert [d["outcome"] for _, d in outputs(again, N.decisions)] == ["duplicate"]


def test_a_synced_answer_for_a_long_ref_is_decided_though_its_id_is_longer_than_a_webhooks() -> None:
    ref = "pay_" + "r" * 190  # a ref the ingest takes (ids up to 200 characters)
    body = synced_event(ref, {"state": "captured", "authorised_minor": 500, "captured_minor": 500,
                              "refunded_minor": 0, "currency": "EUR"}, 1_764_000_000_000)
    assert len(orjson.loads(body)["id"]) > 200
    record = webhook("card", ref, body, "f1", checked=False)
    fetched = type(record)(record.key, record.value, [(k, b"fetch" if k == "source" else v) for k, v in
                                                      record.headers], 0, 0, record.topic)
    plan = plan_batch(N, GATEWAYS, [fetched], lambda p, k: None)
    assert plan.set_aside == []
    assert [d["outcome"] for _, d in outputs(plan, N.decisions)] == ["synced"]
    assert orjson.loads(plan.states[f"card:{ref}".encode()])["events"][0]["kind"] == "synced"


def test_a_synced_event_whose_totals_are_not_of_their_shape_is_set_aside_with_the_reason() -> None:
    body = orjson.dumps({"id": "sync_x", "type": "synced", "payment_ref": "pay_x", "sequence": None,
                         "occurred_at": "2026-11-29T10:02:15Z", "amount_minor": 0, "currency": "EUR",
                         "synced": {"state": "captured", "captured_minor": "a lot"}})
    plan = plan_batch(N, GATEWAYS, numbered([webhook("card", "pay_x", body, "f1")]), lambda p, k: None)
    assert len(plan.set_aside) == 1 and "synced" in plan.set_aside[0][1]


@pytest.mark.parametrize("amount, reason", [(-500, "expected int >= 0"),
                                            (2**64 - 1, "expected int <= 9223372036854775807")])
def test_a_checked_record_whose_amount_breaks_its_limits_is_set_aside_not_added(amount: int, reason: str) -> None:
    """The fallback for checked records loosens the ids only: an amount the read models' checks would
    refuse never reaches the totals (a negative capture would have lowered what the merchant is told)."""
    def event(event_id: str, kind: str, sequence: int, minor: int) -> bytes:
        return orjson.dumps({"id": event_id, "type": f"payment.{kind}", "payment_ref": "pay_n", "sequence": sequence,
                             "occurred_at": "2026-11-29T10:02:15Z", "amount_minor": minor, "currency": "EUR"})

    batch = numbered([webhook("card", "pay_n", event("ev1", "authorised", 1, 1000), "d1"),
                      webhook("card", "pay_n", event("ev2", "captured", 2, amount), "d2"),
                      webhook("card", "pay_n", event("ev3", "captured", 3, 1000), "d3")])
    plan = plan_batch(N, GATEWAYS, batch, lambda p, k: None)
    assert len(plan.set_aside) == 1 and reason in plan.set_aside[0][1]
    state = orjson.loads(plan.states[b"card:pay_n"])
    assert [e["id"] for e in state["events"]] == ["ev1", "ev3"]
    rows = [d["row"] for _, d in outputs(plan, N.decisions) if d.get("row")]
    assert rows[-1]["captured_minor"] == 1000
