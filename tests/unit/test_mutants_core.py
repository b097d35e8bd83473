"""The core's small rules at their edges (killing mutmut's survivors in app/core, docs/testing.md):
a gap due at exactly its limit, a backlog of exactly a busy batch, a state read back as its type, a
re-decided delivery keeping a resource id that holds a colon."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import orjson
import pytest

from app.core.card import CardEvent, effects_due, reduce, stored_event
from app.core.gaps import Gap, due_for_backfill
from app.core.model import Delivery, Recent, redecided
from app.core.pacing import BUSY_BATCH, hold_take
from app.core.reducer import state_codec


def test_a_gap_is_due_at_exactly_its_limit_counted_from_when_it_was_seen() -> None:
    gap, asked = Gap(3, 4, first_seen_ms=1_000), Gap(7, 7, first_seen_ms=1_000, backfill_requested=True)
    assert due_for_backfill([gap, asked], now_ms=6_000, after_ms=5_000) == [gap]
    assert due_for_backfill([gap, asked], now_ms=5_999, after_ms=5_000) == []


def test_a_backlog_of_exactly_a_busy_batch_holds_a_short_take() -> None:
    assert hold_take(7, BUSY_BATCH, 0.0, 10 * BUSY_BATCH)


class Counted(msgspec.Struct):
    n: int = 0
    name: str = ""


def test_the_state_codec_reads_back_the_state_type() -> None:
    load, dump = state_codec(Counted)
    again = load(dump(Counted(3, "x")))
    assert isinstance(again, Counted) and again == Counted(3, "x")


@dataclass
class State:
    n: int = 0
    recent: Recent = field(default_factory=list)


def test_a_recent_delivery_is_redecided_under_its_whole_resource_id() -> None:
    state = State(5, [("d1", [("d1", "applied", 4, "evt_1", "deposit.settled")])])
    d = Delivery("d1", "pg", "pg:dep:1", received_at_ms=9, seq=3)
    (again,) = redecided(state, d) or []
    assert (again.gateway, again.resource_id, again.outcome, again.seq) == ("pg", "dep:1", "applied", 4)
    assert (again.event_id, again.event_type, again.received_at_ms) == ("evt_1", "deposit.settled", 9)
    assert redecided(state, Delivery("d2", "pg", "pg:dep:1", 9, 3)) is None
    assert redecided(None, d) is None


def stored(**changed: object) -> bytes:
    return orjson.dumps({"id": "e1", "type": "payment.captured", "payment_ref": "pay_1", "sequence": 4,
                         "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 50, "currency": "EUR", **changed})


def test_a_stored_card_event_is_read_back_as_the_reducer_orders_it() -> None:
    assert stored_event(stored()) == CardEvent("e1", "captured", 1_795_946_535_123, 50, 4)
    with pytest.raises(ValueError, match=r"^unusable card event: amount_minor: expected int >= 0$"):
        stored_event(stored(amount_minor=-5))


def test_an_order_is_paid_once_a_captured_payment_holds_money() -> None:
    def due(*events: CardEvent) -> list[str]:
        return effects_due(reduce(list(events)), set())

    auth = CardEvent("a", "authorised", 1, 100)
    assert due(auth, CardEvent("c", "captured", 2, 1)) == ["mark_order_paid"]  # one minor unit is money
    assert due(auth, CardEvent("c", "captured", 2, 0)) == []  # a capture of nothing pays nothing
    fetched = {"state": "authorised", "authorised_minor": 100, "captured_minor": 50, "refunded_minor": 0}
    assert due(CardEvent("s", "synced", 1, 0, synced=fetched)) == []  # money, but not a captured state
    assert due(auth, CardEvent("c", "captured", 2, 100), CardEvent("r", "refunded", 3, 100)) == [
        "mark_order_paid", "mark_order_refunded"]
    assert effects_due(reduce([auth, CardEvent("c", "captured", 2, 100)]), {"mark_order_paid"}) == []


def test_card_ties_on_one_millisecond_are_decided_by_the_rank_not_the_id() -> None:
    """Issue #46: a refund and a capture at the same millisecond; the refund's id sorts first."""
    out = reduce([CardEvent("a", "authorised", 0, 100), CardEvent("c1", "captured", 1, 50),
                  CardEvent("a-r", "refunded", 2, 50), CardEvent("b-c", "captured", 2, 50)])
    assert (out.state, out.captured_minor, out.refunded_minor, out.parked) == ("captured", 100, 50, [])
    assert out.applied == ["a", "c1", "b-c", "a-r"]


def test_card_sequences_order_the_events_whatever_their_clocks_say() -> None:
    """Issue #46: by the clocks the refund comes before the second capture (refunded, a capture parked
    for ever); by the sequences after it."""
    out = reduce([CardEvent("a", "authorised", 0, 100, sequence=1), CardEvent("c1", "captured", 1, 50, sequence=2),
                  CardEvent("c2", "captured", 3, 50, sequence=3), CardEvent("r", "refunded", 2, 50, sequence=4)])
    assert (out.state, out.captured_minor, out.refunded_minor, out.parked) == ("captured", 100, 50, [])
    assert out.applied == ["a", "c1", "c2", "r"]
