"""The card reducer: the playbook's pay_8c21 walk-through, parking, synced events, properties."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.card import CardEvent, Reduced, effects_due, parse_time_ms, reduce
from app.gateways.base import Route
from app.gateways.card import Synced, Webhook, read, route

T0 = parse_time_ms("2026-11-29T10:02:15.123Z")


def ev(eid: str, kind: str, at: int, amount: int = 0, sequence: int | None = None) -> CardEvent:
    return CardEvent(eid, kind, T0 + at, amount, sequence)


def totals(r: Reduced) -> tuple[str, int, int, int]:
    return r.state, r.authorised_minor, r.captured_minor, r.refunded_minor


def test_capture_before_authorisation_parks_then_applies() -> None:
    capture, auth = ev("e2", "captured", 4_000, 12000), ev("e1", "authorised", 0, 12000)
    assert reduce([capture]).parked == ["e2"]
    assert totals(reduce([capture, auth])) == ("captured", 12000, 12000, 0)


def test_pay_8c21_partial_refund_between_captures_applies() -> None:
    events = [ev("a", "authorised", 0, 12000), ev("c1", "captured", 1000, 8000),
              ev("r", "refunded", 2000, 3500), ev("c2", "captured", 3000, 3500)]
    r = reduce(events)
    assert totals(r) == ("captured", 12000, 11500, 3500) and r.parked == []


def test_pay_8c21_over_refund_parks_until_the_capture_lands() -> None:
    events = [ev("a", "authorised", 0, 12000), ev("c1", "captured", 1000, 8000), ev("r", "refunded", 2000, 10000)]
    r = reduce(events)
    assert totals(r) == ("captured", 12000, 8000, 0) and r.parked == ["r"]
    r = reduce([*events, ev("c2", "captured", 3000, 3500)])
    assert totals(r) == ("captured", 12000, 11500, 10000) and r.parked == []
    assert r.applied == ["a", "c1", "c2", "r"]


def test_only_level_totals_move_to_refunded() -> None:
    r = reduce([ev("a", "authorised", 0, 5000), ev("c", "captured", 1, 5000), ev("r", "refunded", 2, 5000)])
    assert r.state == "refunded"
    assert effects_due(r, set()) == ["mark_order_paid", "mark_order_refunded"]
    assert effects_due(r, {"mark_order_paid"}) == ["mark_order_refunded"]


def test_same_timestamp_uses_the_rank() -> None:
    # auto-capture in the same millisecond as the authorisation
    r = reduce([ev("zzz", "captured", 0, 100), ev("aaa", "authorised", 0, 100)])
    assert totals(r) == ("captured", 100, 100, 0)


def test_same_millisecond_capture_and_refund_the_rank_puts_the_capture_first() -> None:
    # A refund and a capture in one millisecond: captured (rank 1) before refunded (rank 2). The
    # other way round the refund would level the totals, the payment would close as refunded and
    # the capture would park for ever (issue #46: a lone pair is repaired by parking, this is not).
    r = reduce([ev("a", "authorised", 0, 100), ev("c1", "captured", 1, 50),
                ev("b_refund", "refunded", 2, 50), ev("a_capture", "captured", 2, 50)])
    assert totals(r) == ("captured", 100, 100, 50) and r.parked == []
    assert r.applied == ["a", "c1", "a_capture", "b_refund"]


def test_same_millisecond_void_and_capture_are_ordered_by_event_id() -> None:
    # void and capture share rank 1 (each can only follow the authorisation): the event id is the
    # tie-breaker, so every replay sorts them alike and the loser stays parked, never dropped
    r = reduce([ev("b_void", "voided", 1), ev("a_capture", "captured", 1, 100), ev("auth", "authorised", 0, 100)])
    assert totals(r) == ("captured", 100, 100, 0) and r.parked == ["b_void"]
    r = reduce([ev("a_void", "voided", 1), ev("b_capture", "captured", 1, 100), ev("auth", "authorised", 0, 100)])
    assert r.state == "voided" and r.parked == ["b_capture"]


def test_sequences_beat_clocks_that_disagree_with_them() -> None:
    # By the clocks the refund comes before the second capture and would level the totals (state
    # refunded, the capture parked for ever); by the sequences the capture comes first.
    events = [ev("a", "authorised", 0, 100, sequence=1), ev("c1", "captured", 10, 50, sequence=2),
              ev("r", "refunded", 20, 50, sequence=4), ev("c2", "captured", 30, 50, sequence=3)]
    r = reduce(events)
    assert totals(r) == ("captured", 100, 100, 50) and r.parked == []
    assert r.applied == ["a", "c1", "c2", "r"]


def test_void_after_authorisation() -> None:
    r = reduce([ev("v", "voided", 5), ev("a", "authorised", 0, 700)])
    assert r.state == "voided" and effects_due(r, set()) == ["release_authorisation"]


def test_sequence_wins_over_clocks_when_every_event_has_one() -> None:
    # the capture's clock is earlier, but the gateway's sequence says it came second
    r = reduce([ev("c", "captured", 0, 100, sequence=2), ev("a", "authorised", 50, 100, sequence=1)])
    assert r.applied == ["a", "c"]


def test_synced_event_is_the_new_base() -> None:
    synced = CardEvent("sync", "synced", T0 + 60_000, synced=Synced("captured", 12000, 12000, 0))
    # the authorisation never arrived: the fetch brings the payment to Captured
    r = reduce([ev("c", "captured", 4_000, 12000), synced])
    assert r.state == "captured" and r.captured_minor == 12000
    later_refund = ev("r", "refunded", 70_000, 2000)
    assert totals(reduce([synced, later_refund])) == ("captured", 12000, 12000, 2000)


def test_redelivery_with_the_same_id_counts_once_and_a_fresh_id_is_visible() -> None:
    base = [ev("a", "authorised", 0, 9000), ev("c", "captured", 1, 8000)]
    assert reduce([*base, base[1]]).captured_minor == 8000
    # a redelivery under a fresh id is a second event to the reducer (reconciliation sees two rows)
    assert reduce([*base, ev("c_again", "captured", 1, 8000)]).parked == []


def test_event_parsing_refuses_floats() -> None:
    body = {"id": "e", "type": "payment.captured", "payment_ref": "p", "sequence": None,
            "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 80.5, "currency": "EUR"}
    refused = read(orjson.dumps(body), checked=True)  # the adapter's read, before the reducer sees it
    assert isinstance(refused, Route) and "amount_minor: expected int" in (refused.quarantine_reason or "")
    taken = read(orjson.dumps({**body, "amount_minor": 8000}), checked=True)
    assert isinstance(taken, Webhook) and parse_time_ms(taken.event.occurred_at) == T0


LIFECYCLE = [("a", "authorised", 0, 12000), ("c1", "captured", 1000, 8000), ("r1", "refunded", 2000, 3000),
             ("c2", "captured", 3000, 3500), ("r2", "refunded", 4000, 8500)]


@settings(max_examples=300)
@given(st.permutations(LIFECYCLE), st.lists(st.sampled_from(LIFECYCLE), max_size=4), st.booleans())
def test_any_order_and_duplication_ends_in_the_gateways_final_state(
        order: list[tuple[str, str, int, int]], dupes: list[tuple[str, str, int, int]], sequenced: bool) -> None:
    def build(e: tuple[str, str, int, int]) -> CardEvent:
        i = [x[0] for x in LIFECYCLE].index(e[0])
        return ev(e[0], e[1], e[2], e[3], sequence=i + 1 if sequenced else None)
    r = reduce([build(e) for e in order + dupes])
    # 11500 captured, 11500 refunded in the end: level totals, so Refunded
    assert totals(r) == ("refunded", 12000, 11500, 11500) and r.parked == []
    assert r == reduce([build(e) for e in LIFECYCLE])  # replay in gateway order equals any arrival order


def test_a_record_no_adapter_took_gets_the_ingests_python_checks_and_a_checked_one_does_not_again() -> None:
    raw = orjson.dumps({"id": "evt_1", "type": "payment.authorised", "payment_ref": "pay_1",
                        "occurred_at": "1999-12-31T23:59:59Z", "amount_minor": 100})
    refused = read(raw, False)
    assert isinstance(refused, Route) and refused.quarantine_reason == route(raw).quarantine_reason
    assert refused.quarantine_reason is not None and "occurred_at" in refused.quarantine_reason
    taken = read(raw, True)  # the ingest refuses such a body: marked checked, it passed its checks
    assert isinstance(taken, Webhook) and taken.event.occurred_at == "1999-12-31T23:59:59Z"
