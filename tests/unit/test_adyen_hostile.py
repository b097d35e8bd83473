"""The adyen gateway against hostile and odd input (a review's findings, each a regression test):
cost and state bounded for one request, refunds against what was authorised, dispute items without
originalReference, rows the read model's CHECKs accept, limits per item, the earliest authorisation's
reference and currency, idempotent quarantine ids (docs/gateways/adyen.md)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import adyen as core
from app.core.model import APPLIED, DUPLICATE, PARKED, QUARANTINED
from app.gateways import adyen
from app.gateways.limits import INT64_MAX
from tests.unit.test_adyen_core import PSP, final, item, run
from tests.unit.test_adyen_gateway import KEY, Appender, documented_item, receiver


def row_of(decisions: list[Any]) -> dict[str, Any]:
    found, _ = final(decisions)
    assert found is not None
    return dict(found)


# --- H1: one request cannot stall the partition or outgrow the state -------------------------

def test_a_request_of_more_items_than_adyen_sends_is_quarantined_whole_naming_the_field() -> None:
    six = [{**documented_item(), "pspReference": f"P{i}"} for i in range(adyen.MAX_ITEMS)]
    assert len(adyen.split(adyen.sign_body(six, KEY))) == 6
    raw = adyen.sign_body([*six, documented_item()], KEY)
    [(record, route)] = adyen.split(raw)
    assert record == raw and route.resource_key is None and route.quarantine_code == "too_many_items"
    assert route.quarantine_reason == "notificationItems: 7 items, at most 6 in one request"


async def test_the_ingest_stores_an_oversized_request_as_one_quarantine_record() -> None:
    appender = Appender()
    r, topics = receiver(appender)
    items = [{**documented_item(), "pspReference": f"P{i}"} for i in range(2000)]
    assert await r.webhook("adyen", adyen.sign_body(items, KEY), {}) == (200, b"[accepted]")
    assert [t for t, *_ in appender.records] == [topics.quarantine]


def test_the_dedupe_key_has_signed_fields_only_so_a_replayed_item_with_other_dates_is_one_item() -> None:
    auth = item("AUTHORISATION", 1, 1000)
    replays = [{**auth, "eventDate": f"2026-12-0{1 + i % 9}T00:00:{i % 60:02d}+00:00"} for i in range(50)]
    state, decisions = run([auth, *replays])
    assert len(state.events) == 1 and [d.outcome for d in decisions].count(DUPLICATE) == 50


def test_the_reducer_tries_each_item_a_bounded_number_of_times() -> None:
    """The review's case: many parked items early, many applying no-ops later (was quadratic)."""
    n = 1000
    events = [core.AdyenEvent("a", "AUTHORISATION", True, PSP, 1_000, 100, currency="EUR")]
    events += [core.AdyenEvent(f"f{i}", "CAPTURE_FAILED", True, f"X{i}", 2_000 + i, 1, currency="EUR")
               for i in range(n)]
    events += [core.AdyenEvent(f"r{i}", "AUTHORISATION", True, PSP, 10_000_000 + i, 100, currency="EUR")
               for i in range(n)]
    out = core.reduce(events)
    assert len(out.parked) == n and out.steps <= 2 * len(events)


def test_a_payment_keeps_at_most_max_events_items_and_quarantines_the_rest_naming_the_field() -> None:
    items = [item("AUTHORISATION", 0, 10_000)]
    items += [item("REFUND_FAILED", 1 + i, 1, f"X{i}") for i in range(core.MAX_EVENTS + 20)]  # all parked
    state, decisions = run(items)
    assert len(state.events) == core.MAX_EVENTS
    quarantined = [d for d in decisions if d.outcome == QUARANTINED]
    assert len(quarantined) == 21 and (quarantined[0].error or "").startswith("originalReference: ")
    assert len(core.dump(state)) < 64 * 1024  # far below a record's 1 MiB


def test_a_recapture_of_the_same_psp_reference_is_told_apart_by_its_reason_in_any_order() -> None:
    made = [item("AUTHORISATION", 1, 1000), item("CAPTURE", 2, 1000, "CAP1"), item("CAPTURE_FAILED", 3, 1000, "CAP1"),
            item("CAPTURE", 4, 1000, "CAP1", reason="Transaction Recaptured")]
    for arrived in (made, made[::-1], [made[3], made[0], made[2], made[1]]):
        _, decisions = run(arrived)
        assert (row_of(decisions)["state"], row_of(decisions)["captured_minor"]) == ("captured", 1000)
    _, decisions = run(made[:3])  # not re-captured
    assert row_of(decisions)["captured_minor"] == 0


# --- H2: mark_order_refunded against what was authorised ------------------------------------

def test_a_refund_arriving_before_an_earlier_partial_capture_does_not_mark_the_order_refunded() -> None:
    a, cap1, cap2 = item("AUTHORISATION", 0, 100), item("CAPTURE", 1, 50, "CAP1"), item("CAPTURE", 2, 50, "CAP2")
    ref1 = item("REFUND", 3, 50, "REF1")
    for arrived in ([a, cap1, cap2, ref1], [a, cap1, ref1, cap2]):
        _, decisions = run(arrived)
        assert {e.type for d in decisions for e in d.effects} == {"mark_order_paid"}
    _, decisions = run([a, cap1, ref1, cap2, item("REFUND", 4, 50, "REF2")])
    assert {e.type for d in decisions for e in d.effects} == {"mark_order_paid", "mark_order_refunded"}


# --- H3: dispute items without originalReference ---------------------------------------------

def test_a_modification_or_dispute_without_original_reference_is_quarantined_naming_it() -> None:
    for code in ("CHARGEBACK_REVERSED", "SECOND_CHARGEBACK", "CAPTURE"):
        body = {**documented_item(), "eventCode": code, "pspReference": "DISPUTE000000001"}
        route = adyen.route(orjson.dumps(body))
        assert route.resource_key is None and route.quarantine_reason == f"originalReference: required for {code}"
    assert adyen.route(orjson.dumps(documented_item())).resource_key == "adyen:7914073381342284"


# --- M1: never a row the read model's CHECKs refuse ------------------------------------------

def test_a_refund_repeating_a_psp_reference_with_another_amount_parks_and_refunded_stays_within_captured() -> None:
    _, decisions = run([item("AUTHORISATION", 0, 100), item("CAPTURE", 1, 100, "C"), item("REFUND", 2, 10, "R"),
                        item("REFUND", 3, 500, "R")])
    assert decisions[-1].outcome == PARKED and (decisions[-1].error or "").startswith("amount.value: refund")
    row = row_of(decisions)
    assert (row["captured_minor"], row["refunded_minor"]) == (100, 10)


def test_a_capture_repeating_a_psp_reference_with_another_amount_parks() -> None:
    _, decisions = run([item("AUTHORISATION", 0, 100), item("CAPTURE", 1, 100, "C"), item("REFUND", 2, 100, "R"),
                        item("CAPTURE", 3, 10, "C")])
    assert decisions[-1].outcome == PARKED and (decisions[-1].error or "").startswith("amount.value: capture")
    assert row_of(decisions)["refunded_minor"] <= row_of(decisions)["captured_minor"] == 100


def test_captures_never_pass_what_was_authorised_nor_64_bits() -> None:
    _, decisions = run([item("AUTHORISATION", 0, INT64_MAX), item("CAPTURE", 1, INT64_MAX, "C1"),
                        item("CAPTURE", 2, INT64_MAX, "C2")])
    assert row_of(decisions)["captured_minor"] == INT64_MAX
    assert decisions[-1].outcome == PARKED and "amount.value" in (decisions[-1].error or "")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["CAPTURE", "REFUND", "CAPTURE_FAILED", "REFUND_FAILED",
                                           "CANCEL_OR_REFUND"]),
                          st.sampled_from(["A", "B"]), st.integers(1, 9), st.sampled_from([1, 50, 100, INT64_MAX])),
                max_size=8), st.randoms())
def test_every_row_keeps_the_read_models_checks(steps: list[tuple[str, str, int, int]], rnd: Any) -> None:
    items = [item("AUTHORISATION", 0, 100)] + [item(code, at, value, psp) for code, psp, at, value in steps]
    rnd.shuffle(items)
    _, decisions = run(items)
    for d in decisions:
        if d.row is not None:
            row = d.row
            assert 0 <= row["refunded_minor"] <= row["captured_minor"] <= row["authorised_minor"] <= INT64_MAX


# --- M3, L3: limits per item; a deep unsigned field is quarantined, not refused --------------

def test_one_item_too_deep_is_quarantined_alone() -> None:
    deep = {**documented_item(), "pspReference": "DEEP", "x": orjson.loads(b"[" * 40 + b"]" * 40)}
    parts = adyen.split(adyen.sign_body([documented_item(), deep], KEY))
    assert parts[0][1].resource_key == "adyen:7914073381342284"
    assert parts[1][1].resource_key is None and "nests deeper than 32" in (parts[1][1].quarantine_reason or "")


async def test_a_signed_body_with_a_very_deep_unsigned_field_is_quarantined_and_a_forged_one_refused() -> None:
    good = adyen.sign_body([documented_item()], KEY)
    deep = good.replace(b'"merchantReference"', b'"x":' + b"[" * 200_000 + b"]" * 200_000 + b',"merchantReference"', 1)
    appender = Appender()
    r, topics = receiver(appender)
    assert await r.webhook("adyen", deep, {}) == (200, b"[accepted]")
    assert [t for t, *_ in appender.records] == [topics.quarantine]
    forged = deep.replace(b"TestPayment-1407325143704", b"TestPayment-1407325143705")
    assert (await r.webhook("adyen", forged, {}))[0] == 401


# --- M4: the payment's reference and currency ------------------------------------------------

def test_reference_and_currency_are_the_earliest_authorisations_and_another_currency_parks() -> None:
    first = item("AUTHORISATION", 1, 1000)
    later = {**item("AUTHORISATION", 5, 999), "merchantReference": "order-2",
             "amount": {"value": 999, "currency": "USD"}}
    usd = {**item("CAPTURE", 6, 500, "CAP1"), "amount": {"value": 500, "currency": "USD"}}
    _, decisions = run([first, later, usd])
    row = row_of(decisions)
    assert (row["merchant_reference"], row["currency"], row["captured_minor"]) == ("order-1", "EUR", 0)
    assert decisions[2].outcome == PARKED and decisions[2].error == "amount.currency: USD is not the payment's EUR"
    state, decisions = run([later, usd, first])  # the later authorisation arrived first: corrected
    row = row_of(decisions)
    assert (row["merchant_reference"], row["currency"], row["captured_minor"]) == ("order-1", "EUR", 0)
    assert decisions[-1].outcome == APPLIED and len(state.applied) == 2


# --- L1: a resent request quarantines its bad items under the same ids -----------------------

async def test_a_resent_request_quarantines_its_bad_item_under_the_same_delivery_id() -> None:
    body = adyen.sign_body([documented_item(), {**documented_item(), "eventCode": "X"}], KEY)
    appender = Appender(fail_on=0)
    r, topics = receiver(appender)
    assert (await r.webhook("adyen", body, {}))[0] == 503
    assert (await r.webhook("adyen", body, {}))[0] == 200
    ids = [dict(h)["delivery_id"] for t, _, _, h in appender.records if t == topics.quarantine]
    assert len(ids) == 2 and ids[0] == ids[1]
