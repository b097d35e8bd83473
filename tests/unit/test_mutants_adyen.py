"""The adyen reducer against slower or literal statements of its rules (killing mutmut's survivors,
docs/testing.md): the one pass equals restarting from the lowest key after every applied item, as
its docstring states (a naive restart written here), and one delivery's decisions field by field."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.adyen import (
    MAX_EVENTS,
    RANK,
    AdyenEvent,
    Reduced,
    State,
    _applied,
    apply_event,
    event_of,
    order_key,
    parse_time_ms,
    reduce,
    snapshot,
    step,
)
from app.core.model import APPLIED, DUPLICATE, PARKED, QUARANTINED, UNPARKED, Delivery
from tests.unit.test_adyen_core import PSP, T0, item, notification


def restarted(events: list[AdyenEvent]) -> Reduced:
    """After every applied item, look again from the lowest key: the slow rule the pass stands for."""
    out = Reduced()
    pending = sorted({e.id: e for e in events}.values(), key=order_key)
    while (ready := next((e for e in pending if step(out, e)), None)) is not None:
        pending.remove(ready)
        _applied(out, ready)
    out.parked = [e.id for e in pending]
    return out


def seen(out: Reduced) -> tuple[object, ...]:
    return (out.state, out.authorised_minor, out.captures, out.failed, out.refunds, out.applied, out.parked,
            out.earned, out.updated_ms, out.currency)


MONEY = ["CAPTURE", "REFUND", "CAPTURE_FAILED", "REFUND_FAILED", "CANCELLATION", "CANCEL_OR_REFUND"]
# mostly money movements, mostly carried out, in the authorisation's currency, after it: the histories
# where an item waits for another and must be looked at again after it
fields = st.tuples(st.sampled_from(MONEY * 3 + sorted(RANK)), st.sampled_from([True, True, False]),
                   st.sampled_from(["p1", "p2"]), st.integers(0, 5), st.sampled_from([0, 40, 60, 100]),
                   st.sampled_from(["EUR", "EUR", "USD"]), st.sampled_from([False, False, True]))


def items(drawn: list[tuple[str, bool, str, int, int, str, bool]]) -> list[AdyenEvent]:
    return [AdyenEvent(f"e{i}", code, success, psp, at, amount, currency=currency,
                       recapture=recapture and code == "CAPTURE")
            for i, (code, success, psp, at, amount, currency, recapture) in enumerate(drawn)]


authorisation = st.builds(lambda at, amount: AdyenEvent("auth", "AUTHORISATION", True, "psp", at, amount,
                                                        currency="EUR"),
                          st.sampled_from([0, 0, 0, 2]), st.sampled_from([100, 160]))


@settings(max_examples=600, deadline=None)
@given(authorisation, st.lists(fields, max_size=8).map(items))
def test_the_one_pass_is_the_restart_from_the_lowest_key(auth: AdyenEvent, rest: list[AdyenEvent]) -> None:
    events = [auth, *rest]
    assert seen(reduce(events)) == seen(restarted(events))


def ev(i: str, code: str, psp: str, at: int, amount: int = 0, *, recapture: bool = False,
       success: bool = True) -> AdyenEvent:
    return AdyenEvent(i, code, success, psp, at, amount, currency="EUR", recapture=recapture)


AUTH = ev("auth", "AUTHORISATION", "psp", 0, 100)


def test_a_recapture_waits_for_the_failure_it_re_captures() -> None:
    out = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("again", "CAPTURE", "c1", 2, 100, recapture=True),
                  ev("f", "CAPTURE_FAILED", "c1", 3)])
    assert (out.state, out.captures, out.failed, out.parked) == ("captured", {"c1": 100}, {}, [])
    assert out.applied == ["auth", "c", "f", "again"]


def test_a_capture_repeating_a_pspreference_is_no_change_with_its_amount_and_parked_with_another() -> None:
    same = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 60), ev("c'", "CAPTURE", "c1", 2, 60)])
    assert (same.captures, same.applied, same.parked) == ({"c1": 60}, ["auth", "c", "c'"], [])
    failed = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 60), ev("f", "CAPTURE_FAILED", "c1", 2),
                     ev("c'", "CAPTURE", "c1", 3, 40)])
    assert (failed.captures, failed.failed, failed.parked) == ({}, {"c1": 60}, ["c'"])
    assert failed.why == {"c'": "amount.value: capture c1 is held at 60 already"}
    held = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 60), ev("c'", "CAPTURE", "c1", 2, 40)])
    assert (held.captures, held.parked, held.why) == ({"c1": 60}, ["c'"],
                                                     {"c'": "amount.value: capture c1 is held at 60 already"})


def test_a_cancelled_payment_takes_only_repeated_cancellations() -> None:
    out = reduce([AUTH, ev("x", "CANCELLATION", "x1", 1), ev("x'", "CANCELLATION", "x2", 2),
                  ev("cr", "CANCEL_OR_REFUND", "x3", 3), ev("c", "CAPTURE", "c1", 4, 50),
                  ev("r", "REFUND", "r1", 5, 10)])
    assert (out.state, out.captures, out.applied, out.parked) == ("cancelled", {}, ["auth", "x", "x'", "cr"],
                                                                  ["c", "r"])


def test_a_refund_above_what_is_captured_waits() -> None:
    out = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 40), ev("r", "REFUND", "r1", 2, 60)])
    assert (out.state, out.refunds, out.parked) == ("captured", {}, ["r"])
    failed = reduce([AUTH, ev("rf", "REFUND_FAILED", "r1", 1), ev("cf", "CAPTURE_FAILED", "c9", 1)])
    assert (failed.state, failed.parked) == ("authorised", ["cf", "rf"])


def test_cancel_or_refund_of_a_fully_refunded_payment_refunds_nothing_more() -> None:
    out = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("r", "REFUND", "r1", 2, 100),
                  ev("cr", "CANCEL_OR_REFUND", "x1", 3)])
    assert (out.state, out.refunds) == ("refunded", {"r1": 100})


def test_effects_one_minor_unit_pays_and_every_chargeback_opens_a_dispute() -> None:
    assert reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 1)]).earned == ["mark_order_paid"]
    for code in ("NOTIFICATION_OF_CHARGEBACK", "CHARGEBACK", "SECOND_CHARGEBACK"):
        out = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("cb", code, "d1", 2)])
        assert out.earned == ["mark_order_paid", "open_dispute"]
    unsuccessful = reduce([AUTH, ev("cb", "CHARGEBACK", "d1", 2, success=False)])
    assert unsuccessful.earned == []


def test_an_item_that_applies_after_waiting_loses_its_reason() -> None:
    out = reduce([AUTH, ev("c", "CAPTURE", "c1", 2, 100),
                  AdyenEvent("r", "REFUND", True, "r1", 1, 50, currency="USD")])
    assert out.why == {"r": "amount.currency: USD is not the payment's EUR"}
    freed = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("c2", "CAPTURE", "c2", 2, 50),
                    ev("f", "CAPTURE_FAILED", "c1", 3)])
    assert (freed.captures, freed.parked, freed.why) == ({"c2": 50}, [], {})


# --- one delivery's decisions, field by field (apply_event) -----------------------------------

def _deliver(bodies: list[dict[str, Any]]) -> tuple[State, list[list[dict[str, Any]]]]:
    """Each body delivered in turn (delivery ``d<i>``, received at T0 + 10 i, partition seq 7 + i)."""
    state: State | None = None
    made = []
    for i, body in enumerate(bodies):
        d = Delivery(f"d{i}", "adyen", f"adyen:{PSP}", T0 + 10 * i, 7 + i)
        state, decisions = apply_event(state, notification(body), d)
        made.append([orjson.loads(x.to_bytes()) for x in decisions])
    assert state is not None
    return state, made


def test_the_item_that_frees_a_parked_one_writes_the_row_the_effect_and_the_unparked_delivery() -> None:
    capture = item("CAPTURE", 5, 1000, "CAP1")
    state, made = _deliver([capture, item("REFUND", 6, 2000, "REF1"), item("AUTHORISATION", 1, 1000)])
    head: dict[str, Any] = {"gateway": "adyen", "resource_id": PSP, "sequence": None, "facts": []}
    assert made[0] == [{**head, "delivery_id": "d0", "outcome": PARKED, "received_at_ms": T0, "seq": 1,
                        "event_id": "CAP1:CAPTURE:true:1000:EUR", "event_type": "CAPTURE", "row": None,
                        "table": None, "effects": [], "payload": capture, "error": None}]
    assert [m["outcome"] for m in made[1]] == [PARKED] and made[1][0]["seq"] == 2
    row = {"psp_reference": PSP, "merchant_reference": "order-1", "state": "captured", "authorised_minor": 1000,
           "captured_minor": 1000, "refunded_minor": 0, "currency": "EUR",
           "updated_at": "2026-11-30T00:53:25+00:00", "version": 3}
    paid = {"dedupe_key": f"adyen:{PSP}:mark_order_paid", "type": "mark_order_paid", "gateway": "adyen",
            "resource_id": PSP, "caused_by": "d2",
            "payload": {"psp_reference": PSP, "merchant_reference": "order-1", "state": "captured",
                        "captured_minor": 1000, "refunded_minor": 0, "currency": "EUR"}}
    applied, unparked = made[2]
    assert applied == {**head, "delivery_id": "d2", "outcome": APPLIED, "received_at_ms": T0 + 20, "seq": 3,
                       "event_id": f"{PSP}:AUTHORISATION:true:1000:EUR", "event_type": "AUTHORISATION",
                       "row": row, "table": "adyen_payments", "effects": [paid],
                       "payload": item("AUTHORISATION", 1, 1000), "error": None}
    assert unparked == {**head, "delivery_id": "d0", "outcome": UNPARKED, "received_at_ms": T0, "seq": 4,
                        "event_id": "CAP1:CAPTURE:true:1000:EUR", "event_type": "CAPTURE", "row": None,
                        "table": None, "effects": [], "payload": None, "error": None}
    assert (state.n, state.emitted, state.merchant_reference, state.currency) == (4, ["mark_order_paid"],
                                                                                   "order-1", "EUR")
    assert orjson.loads(snapshot(state)) == {"state": "captured", "applied": state.applied, "events": 3,
                                             "emitted": ["mark_order_paid"], "parked": 1}
    assert len(state.applied) == 2


def test_a_parked_item_carries_its_reason_and_a_later_item_does_not_re_emit() -> None:
    usd = {**item("REFUND", 3, 10, "REF1"), "amount": {"value": 10, "currency": "USD"}}
    state, made = _deliver([item("AUTHORISATION", 1, 1000), item("CAPTURE", 2, 1000, "CAP1"), usd,
                            item("CAPTURE", 4, 500, "CAP2", success=False)])
    assert [m[0]["outcome"] for m in made] == [APPLIED, APPLIED, PARKED, APPLIED]
    assert made[2][0]["error"] == "amount.currency: USD is not the payment's EUR"
    assert made[2][0]["row"] is None and made[2][0]["table"] is None
    assert [e["type"] for e in made[1][0]["effects"]] == ["mark_order_paid"]
    assert made[3][0]["effects"] == []  # a failed capture: applied, nothing new earned
    assert (made[3][0]["row"]["version"], made[3][0]["row"]["state"]) == (4, "captured")
    assert made[0][0]["row"]["updated_at"] == "2026-11-30T00:53:21+00:00"
    assert made[1][0]["row"]["version"] == 2 and state.emitted == ["mark_order_paid"]


def test_a_resent_item_is_a_duplicate_with_its_body_and_the_hundred_and_first_item_is_quarantined() -> None:
    auth = item("AUTHORISATION", 1, 1000)
    _, made = _deliver([auth, auth])
    assert made[1] == [{"gateway": "adyen", "resource_id": PSP, "sequence": None, "facts": [],
                        "delivery_id": "d1", "outcome": DUPLICATE, "received_at_ms": T0 + 10, "seq": 2,
                        "event_id": f"{PSP}:AUTHORISATION:true:1000:EUR", "event_type": "AUTHORISATION",
                        "row": None, "table": None, "effects": [], "payload": auth, "error": None}]
    bodies = [auth] + [item("REFUND_FAILED", 2, i, f"R{i}") for i in range(MAX_EVENTS)]
    state, made = _deliver(bodies)
    assert len(state.events) == MAX_EVENTS
    last = made[-1][0]
    assert (last["outcome"], last["event_type"], last["payload"]) == (QUARANTINED, "REFUND_FAILED", bodies[-1])
    assert last["event_id"] == "R99:REFUND_FAILED:true:99:EUR"
    assert last["error"] == f"originalReference: payment {PSP} holds 100 notification items, the most one payment keeps"
    assert made[-2][0]["outcome"] == PARKED  # the hundredth is still kept (waiting for its refund)


def test_a_cancellation_after_a_capture_waits_and_cancel_or_refund_refunds_the_rest_even_one_unit() -> None:
    out = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 50), ev("x", "CANCELLATION", "x1", 2)])
    assert (out.state, out.parked) == ("captured", ["x"])
    rest = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("r", "REFUND", "r1", 2, 99),
                   ev("cr", "CANCEL_OR_REFUND", "x1", 3)])
    assert (rest.state, rest.refunds) == ("refunded", {"r1": 99, "x1": 1})
    # a CANCEL_OR_REFUND under a refund's own pspReference adds the rest to it
    same = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("r", "REFUND", "r1", 2, 30),
                   ev("cr", "CANCEL_OR_REFUND", "r1", 3)])
    assert (same.state, same.refunds) == ("refunded", {"r1": 100})


def test_a_payment_key_is_cut_at_its_first_colon_and_an_item_without_a_delivery_has_none() -> None:
    d = Delivery("d0", "adyen", "adyen:PSP:1", T0, 0)
    _, (decision,) = apply_event(None, notification(item("AUTHORISATION", 1, 1000)), d)
    assert decision.row is not None and decision.row["psp_reference"] == "PSP:1"
    assert [e.dedupe_key for e in decision.effects] == []
    alone = event_of(notification(item("AUTHORISATION", 1, 1000)).item)
    assert (alone.delivery_id, alone.received_at_ms) == ("", 0)


def test_an_event_date_without_an_offset_is_utc_and_an_offset_is_kept() -> None:
    utc = parse_time_ms("2026-01-01T00:00:00+00:00")
    assert parse_time_ms("2026-01-01T00:00:00") == parse_time_ms("2026-01-01T00:00:00Z") == utc
    assert parse_time_ms("2026-01-01T01:00:00+01:00") == utc


def test_an_event_date_without_an_offset_is_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        assert parse_time_ms("2026-01-01T00:00:00") == parse_time_ms("2026-01-01T00:00:00+00:00")
    finally:
        monkeypatch.undo()
        time.tzset()


# --- the dispute items and what follows a refusal (step), docs/gateways/adyen.md's decisions ----

def test_a_notice_of_chargeback_changes_no_state_and_applies_even_during_a_chargeback() -> None:
    captured = [AUTH, ev("c", "CAPTURE", "c1", 1, 100)]
    notice = reduce([*captured, ev("n", "NOTIFICATION_OF_CHARGEBACK", "d1", 2)])
    assert (notice.state, notice.applied, notice.earned) == ("captured", ["auth", "c", "n"],
                                                             ["mark_order_paid", "open_dispute"])
    during = reduce([*captured, ev("cb", "CHARGEBACK", "d1", 2), ev("n", "NOTIFICATION_OF_CHARGEBACK", "d1", 3)])
    assert (during.state, during.applied, during.parked) == ("chargeback", ["auth", "c", "cb", "n"], [])


def test_a_second_chargeback_charges_back_and_a_reversal_returns_to_the_state_before_the_first() -> None:
    captured = [AUTH, ev("c", "CAPTURE", "c1", 1, 100)]
    second = reduce([*captured, ev("s", "SECOND_CHARGEBACK", "d1", 2)])
    assert (second.state, second.before_chargeback) == ("chargeback", "captured")
    again = reduce([*captured, ev("cb", "CHARGEBACK", "d1", 2), ev("s", "SECOND_CHARGEBACK", "d1", 3),
                    ev("rv", "CHARGEBACK_REVERSED", "d1", 4)])
    assert (again.state, again.applied, again.parked) == ("captured", ["auth", "c", "cb", "s", "rv"], [])


def test_a_reversal_waits_for_its_chargeback_and_money_waits_for_the_reversal() -> None:
    # the reversal stamped before the chargeback it reverses: parked until the chargeback applies
    early = reduce([AUTH, ev("rv", "CHARGEBACK_REVERSED", "d1", 1), ev("cb", "CHARGEBACK", "d1", 2)])
    assert (early.state, early.applied, early.parked) == ("authorised", ["auth", "cb", "rv"], [])
    alone = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("rv", "CHARGEBACK_REVERSED", "d1", 2)])
    assert (alone.state, alone.parked) == ("captured", ["rv"])
    held = reduce([AUTH, ev("c", "CAPTURE", "c1", 1, 100), ev("cb", "CHARGEBACK", "d1", 2),
                   ev("r", "REFUND", "r1", 3, 40)])
    assert (held.state, held.refunds, held.parked) == ("chargeback", {}, ["r"])


def test_nothing_follows_a_refusal_and_a_second_authorisation_changes_nothing() -> None:
    refused = ev("auth", "AUTHORISATION", "psp", 0, 100, success=False)
    out = reduce([refused, ev("x", "CANCELLATION", "x1", 1), ev("c", "CAPTURE", "c1", 2, 50)])
    assert (out.state, out.authorised_minor, out.applied, out.parked, out.why) == (
        "refused", 0, ["auth"], ["x", "c"], {})
    # a later authorisation of the refused payment, or of a cancelled one: applied, nothing changes
    later = reduce([refused, ev("auth2", "AUTHORISATION", "psp", 1, 100)])
    assert (later.state, later.applied, later.parked) == ("refused", ["auth", "auth2"], [])
    cancelled = reduce([AUTH, ev("x", "CANCELLATION", "x1", 1), ev("auth2", "AUTHORISATION", "psp", 2, 100)])
    assert (cancelled.state, cancelled.applied) == ("cancelled", ["auth", "x", "auth2"])


def test_each_item_is_tried_once_and_a_parked_one_again_after_each_change() -> None:
    # the refund (stamped before its capture) is tried, parked, and tried again once the capture applies
    out = reduce([AUTH, ev("r", "REFUND", "r1", 1, 60), ev("c", "CAPTURE", "c1", 2, 100)])
    assert (out.applied, out.steps) == (["auth", "c", "r"], 4)
