"""The stripe reducer's rules at their edges (killing mutmut's survivors in app/core/stripe.py,
docs/testing.md): what each decision names, what an effect carries, which same-second pairs are a
guess (docs/gateways/stripe.md "Ordering"), a PaymentIntent-less charge's row, the newest dispute's
status, a thin event's time in another zone."""

from __future__ import annotations

import itertools
import time
from typing import Any

import msgspec
import orjson
import pytest

from app.core import stripe as core
from app.core.model import Decision, Delivery
from app.gateways import stripe as adapter
from tests.unit.test_stripe_core import PI, T, charge, deliver, effects, event, intent, refund, row, run, synced, thin


def named(d: Decision) -> tuple[str | None, str | None, Any]:
    return d.event_id, d.event_type, orjson.loads(orjson.dumps(d.payload))  # the body as received, as JSON


def fetches(decisions: list[Decision]) -> list[dict[str, Any]]:
    return [dict(f.data) for d in decisions for f in d.facts if f.kind == "stripe_fetch"]


def test_every_decision_names_its_event_and_carries_the_body_it_decided() -> None:
    body = event("payment_intent.processing", T, intent("processing"), "evt_p")
    state, made = run([body])
    assert [d.outcome for d in made] == ["applied"] and named(made[0]) == (
        "evt_p", "payment_intent.processing", orjson.loads(body))
    state, again = deliver(state, body, 1)
    assert [d.outcome for d in again] == ["duplicate"] and named(again[0]) == named(made[0])
    parked = thin("2026-12-01T10:00:05Z", "evt_thin_1")
    state, made = deliver(state, parked, 2)
    assert [d.outcome for d in made] == ["parked"] and named(made[0]) == (
        "evt_thin_1", "v1.payment_intent.succeeded", orjson.loads(parked))
    answer = synced("succeeded", 2000, 1_796_119_205)
    _, made = deliver(state, answer, 3)
    document = orjson.loads(answer)
    assert made[0].outcome == "synced" and named(made[0]) == (document["id"], "synced", document)


def test_a_thin_event_of_the_fetched_answers_own_second_arriving_after_it_is_stale() -> None:
    at = 1_796_119_200  # 2026-12-01T10:00:00Z: the answer's created is >= the thin event's
    late = thin("2026-12-01T10:00:00Z", "evt_thin_late")
    state, made = run([synced("succeeded", 2000, at), late])
    assert [d.outcome for d in made] == ["synced", "stale"]
    assert named(made[1]) == ("evt_thin_late", "v1.payment_intent.succeeded", orjson.loads(late))
    assert fetches(made) == [] and state.waiting == []


def test_an_effect_carries_the_read_models_values_and_its_dispute() -> None:
    dp = {"id": "dp_1", "object": "dispute", "status": "needs_response", "amount": 2000, "charge": "ch_2",
          "payment_intent": PI, "currency": "eur"}
    state, made = run([event("payment_intent.succeeded", T, intent("succeeded", 2000)),
                       event("charge.refunded", T + 1, charge("ch_2", "succeeded", 500)),
                       event("charge.dispute.created", T + 2, dp)])
    by_kind = {e.type: e.payload for d in made for e in d.effects}
    assert by_kind["mark_order_paid"] == {"payment_intent": PI, "status": "succeeded", "amount_received_minor": 2000,
                                          "amount_refunded_minor": 0, "currency": "eur", "dispute_id": None}
    assert by_kind["open_dispute"] == {"payment_intent": PI, "status": "succeeded", "amount_received_minor": 2000,
                                       "amount_refunded_minor": 500, "currency": "eur", "dispute_id": "dp_1"}
    assert row(state)["amount_refunded_minor"] == 500


def test_a_resource_id_holding_a_colon_is_kept_whole() -> None:
    pid = "pi_1:a"
    state, made = run([event("payment_intent.payment_failed", T, {**intent("requires_payment_method"), "id": pid}),
                       event("payment_intent.processing", T, {**intent("processing"), "id": pid})],
                      key=f"stripe:{pid}")
    assert row(state)["id"] == pid and row(state)["status"] == "requires_payment_method"
    assert [f["resource_id"] for f in fetches(made)] == [pid]
    state, made = deliver(state, event("payment_intent.succeeded", T + 3, {**intent("succeeded", 2000), "id": pid}),
                          5, key=f"stripe:{pid}")
    assert effects(made) == [f"stripe:{pid}:mark_order_paid"]


def test_the_fetch_a_tie_asks_for_names_the_event_that_made_it() -> None:
    failed = event("payment_intent.payment_failed", T, intent("requires_payment_method"), "evt_f")
    step = event("payment_intent.processing", T, intent("processing"), "evt_s")
    _, made = run([failed, step])
    (asked,) = fetches(made)
    assert asked["event_id"] == "evt_s" and asked["resource_id"] == PI
    assert [f.key for d in made for f in d.facts] == [f"stripe:{PI}:fetch:evt_s"]


@pytest.mark.parametrize("bodies", [
    # a failure and a retry's step in different seconds: their order is known
    [event("payment_intent.payment_failed", T, intent("requires_payment_method")),
     event("payment_intent.processing", T + 1, intent("processing"))],
    [event("payment_intent.processing", T, intent("processing")),
     event("payment_intent.payment_failed", T + 1, intent("requires_payment_method"))],
    # a failure and a charge's failure in one second; two steps in one second: the rank places them
    [event("payment_intent.payment_failed", T, intent("requires_payment_method")),
     event("charge.failed", T, charge("ch_1", "failed"))],
    [event("payment_intent.requires_action", T, intent("requires_action")),
     event("payment_intent.processing", T, intent("processing"))],
    # a terminal status is certain whatever shares its second
    [event("payment_intent.payment_failed", T, intent("requires_payment_method")),
     event("payment_intent.processing", T, intent("succeeded", 2000))],
])
def test_only_a_same_second_failure_and_attempt_step_of_a_live_payment_intent_asks_a_fetch(
        bodies: list[bytes]) -> None:
    for order in (bodies, bodies[::-1]):
        _, made = run(order)
        assert fetches(made) == []


# The live PaymentIntent's event types with the status each carries (none terminal).
LIVE = {"payment_intent.created": "requires_payment_method", "payment_intent.requires_action": "requires_action",
        "payment_intent.processing": "processing", "payment_intent.amount_capturable_updated": "requires_capture",
        "payment_intent.partially_funded": "requires_payment_method",
        "payment_intent.payment_failed": "requires_payment_method"}
STEPS = {"payment_intent.requires_action", "payment_intent.processing", "payment_intent.amount_capturable_updated"}


@pytest.mark.parametrize("apart", [0, 1])
def test_every_pair_of_a_live_payment_intents_events_asks_a_fetch_exactly_when_the_document_says(apart: int) -> None:
    """docs/gateways/stripe.md "Cannot be placed with certainty": one second, one `payment_failed`, the
    other `requires_action`, `processing` or `amount_capturable_updated`."""
    for first, second in itertools.combinations(LIVE, 2):
        bodies = [event(first, T, intent(LIVE[first])), event(second, T + apart, intent(LIVE[second]))]
        guess = apart == 0 and "payment_intent.payment_failed" in (first, second) and bool({first, second} & STEPS)
        for order in (bodies, bodies[::-1]):
            _, made = run(order)
            assert len(fetches(made)) == guess, (first, second, apart)


def test_a_refund_of_the_whole_single_minor_unit_refunds_the_order_and_one_without_an_amount_does_not() -> None:
    paid = event("payment_intent.succeeded", T, {**intent("succeeded", 1), "amount": 1})
    _, made = run([paid, event("refund.updated", T + 2, refund("re_1", "succeeded", 1))])
    assert effects(made) == [f"stripe:{PI}:mark_order_paid", f"stripe:{PI}:mark_order_refunded"]
    _, made = run([paid, event("refund.updated", T + 2, {**refund("re_1", "succeeded"), "amount": None})])
    assert effects(made) == [f"stripe:{PI}:mark_order_paid"]


def test_the_snapshot_tells_the_rows_status() -> None:
    state, _ = run([event("payment_intent.processing", T, intent("processing")), thin("2026-12-01T10:00:05Z")])
    summary = msgspec.json.decode(core.snapshot(state), type=core.Summary)
    assert summary == core.Summary("processing", 2, [], 1)


def test_a_stored_event_keeps_the_delivery_that_brought_it() -> None:
    state, _ = deliver(None, event("payment_intent.processing", T, intent("processing")), 3)
    state, _ = deliver(state, synced("succeeded", 2000, T + 9), 4)
    assert [(e.kind, e.type, e.delivery_id, e.received_at_ms, e.source) for e in state.events] == [
        ("snapshot", "payment_intent.processing", "d3", 3_000, "webhook"), ("synced", "synced", "d4", 4_000, "fetch")]


def test_a_fetched_answer_ranks_below_an_event_of_its_own_second() -> None:
    step = event("payment_intent.processing", T, intent("processing"))
    answer = adapter.synced_body(intent("requires_payment_method"), None, [], T)
    for order in ([step, answer], [answer, step]):
        state, _ = run(order)
        assert row(state)["status"] == "processing"


def test_a_thin_events_time_without_a_zone_reads_as_utc_in_any_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "EST+5")  # POSIX: 5 h west of UTC, no zone database needed
    time.tzset()
    try:
        state, _ = run([thin("2026-12-01T10:00:00")])
    finally:
        monkeypatch.undo()
        time.tzset()
    assert state.events[0].created == 1_796_119_200  # 2026-12-01T10:00:00Z


def solo(status: str, captured: bool, amount_captured: int | None) -> bytes:
    ch = {**charge("ch_solo", status), "payment_intent": None, "captured": captured, "amount_captured": amount_captured}
    return event(f"charge.{status}", T, ch)


@pytest.mark.parametrize(("body", "received", "effect"), [
    (solo("succeeded", True, 1500), 1500, "mark_order_paid"),  # amount_captured, not amount
    (solo("succeeded", False, None), 0, None),  # authorised, not captured: not paid
    (solo("pending", False, None), 0, None),
    (solo("failed", False, 0), 0, "mark_order_failed"),
])
def test_a_payment_intent_less_charges_row_and_effects(body: bytes, received: int, effect: str | None) -> None:
    state, made = run([body], key="stripe:ch_solo")
    assert row(state)["amount_received_minor"] == received and row(state)["amount_minor"] == 2000
    assert effects(made) == ([f"stripe:ch_solo:{effect}"] if effect else [])


def test_the_dispute_status_is_the_newest_disputes_whatever_the_ids_and_ranks() -> None:
    def dispute(did: str, status: str) -> dict[str, Any]:
        return {"id": did, "object": "dispute", "status": status, "amount": 2000, "charge": "ch_2",
                "payment_intent": PI, "currency": "eur"}

    state, made = run([event("charge.dispute.updated", T, dispute("dp_z", "under_review")),
                       event("charge.dispute.created", T + 5, dispute("dp_a", "needs_response"))])
    assert row(state)["dispute_status"] == "needs_response"
    assert effects(made) == [f"stripe:{PI}:open_dispute:dp_z", f"stripe:{PI}:open_dispute:dp_a"]
    view = core.view(PI, state.events)
    assert [d[0] for d in view.disputes] == ["dp_z", "dp_a"]  # oldest first


def test_a_fetched_answer_decides_and_unparks_as_its_own_delivery() -> None:
    state, _ = run([thin("2026-12-01T10:00:00Z")])
    w = adapter.read(synced("succeeded", 2000, 1_796_119_205), True)
    assert isinstance(w, adapter.Webhook)
    _, decisions = core.apply_event(state, w, Delivery("f1", "stripe", f"stripe:{PI}", 9, 9, "fetch"))
    assert [(d.outcome, d.event_type) for d in decisions] == [("synced", "synced"),
                                                              ("unparked", "v1.payment_intent.succeeded")]
