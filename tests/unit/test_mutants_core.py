"""The core's small rules at their edges (killing mutmut's survivors in app/core, docs/testing.md):
a gap due at exactly its limit, a backlog of exactly a busy batch, a state read back as its type, a
re-decided delivery keeping a resource id that holds a colon."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson
import pytest

from app.core import pg as pg_core
from app.core.card import CardEvent, covered_upto, effects_due, ordering_key, reduce, stored_event
from app.core.card import State as CardState
from app.core.card import apply_event as card_apply
from app.core.card import snapshot as card_snapshot
from app.core.gaps import Gap, due_for_backfill
from app.core.model import Decision, Delivery, Recent, redecided
from app.core.pacing import BUSY_BATCH, hold_take
from app.core.paymos import snapshot as paymos_snapshot
from app.core.pg import Parked as PgParked
from app.core.pg import State as PgState
from app.core.pg import apply_correlation as pg_correlate
from app.core.reducer import state_codec
from app.gateways.card import Synced
from app.gateways.card import Webhook as CardWebhook
from app.gateways.card import read as card_read
from tests.pg_events import deposit, withdrawal
from tests.unit.test_paymos_core import T0, applied, event
from tests.unit.test_paymos_core import run as paymos_run
from topics.records import Correlation


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


# --- paymos: one delivery's decisions, field by field (apply_event, _retry_parked) ------------

def _seen(out: list[Decision]) -> list[tuple[object, ...]]:
    """What each decision says of its delivery, its event, its row and its effects."""
    return [(d.delivery_id, d.outcome, d.received_at_ms, d.seq, d.event_id, d.error, d.table,
             None if d.row is None else (d.row["status"], d.row["applied_seq"], d.row["updated_at_ms"]),
             [(e.dedupe_key, e.type, e.payload, e.caused_by) for e in d.effects],
             None if d.payload is None else orjson.loads(orjson.dumps(d.payload))["event_id"])
            for d in out]


WAITS = "change out of a terminal state waits for its reorg"
AT = 1_700_000_000_000  # tests/unit/test_paymos_core.py's delivery n is received at AT + n


def test_paymos_parked_changes_retried_oldest_first_after_a_reorg_one_applies_and_an_older_turns_stale() -> None:
    state, out = paymos_run([event("withdrawal.completed", "wd_1", "completed", 200, amount="1.5"),
                             event("withdrawal.completed", "wd_1", "completed", 400, event_id="again"),
                             event("withdrawal.failed", "wd_1", "failed", 300),
                             event("withdrawal.cancelled", "wd_1", "cancelled", 240),
                             event("withdrawal.completion_rewound", "wd_1", "processing", 250)], key="paymos:wd_1")
    completed = [("paymos:wd_1:payout_completed:0", "payout_completed",
                  {"withdrawal_id": "wd_1", "status": "completed", "amount": "1.5"}, "dlv_0")]
    assert _seen(out) == [
        ("dlv_0", "applied", AT, 1, "evt_wd_1_withdrawal.completed_200", None, "paymos_withdrawals",
         ("completed", 1, T0 + 200), completed, "evt_wd_1_withdrawal.completed_200"),
        ("dlv_1", "parked", AT + 1, 2, "again", WAITS, None, None, [], "again"),
        ("dlv_2", "parked", AT + 2, 3, "evt_wd_1_withdrawal.failed_300", WAITS, None, None, [],
         "evt_wd_1_withdrawal.failed_300"),
        ("dlv_3", "parked", AT + 3, 4, "evt_wd_1_withdrawal.cancelled_240", WAITS, None, None, [],
         "evt_wd_1_withdrawal.cancelled_240"),
        ("dlv_4", "applied", AT + 4, 5, "evt_wd_1_withdrawal.completion_rewound_250", None, "paymos_withdrawals",
         ("processing", 2, T0 + 250),
         [("paymos:wd_1:payout_reopened:0", "payout_reopened", {"withdrawal_id": "wd_1", "status": "processing"},
           "dlv_4")], "evt_wd_1_withdrawal.completion_rewound_250"),
        # the parked ones, oldest first: the cancellation is older than the reorg (stale), the
        # failure applies, and the second completion still waits for a reorg of the failure
        ("dlv_3", "stale", AT + 3, 6, "evt_wd_1_withdrawal.cancelled_240", None, None, None, [],
         "evt_wd_1_withdrawal.cancelled_240"),
        ("dlv_2", "unparked", AT + 2, 7, "evt_wd_1_withdrawal.failed_300", None, "paymos_withdrawals",
         ("failed", 3, T0 + 300),
         [("paymos:wd_1:payout_failed:1", "payout_failed", {"withdrawal_id": "wd_1", "status": "failed"}, "dlv_2")],
         "evt_wd_1_withdrawal.failed_300"),
    ]
    assert [p.delivery.delivery_id for p in state.parked] == ["dlv_1"]
    assert (state.n, state.applied, state.cycle) == (7, 3, 1)
    assert orjson.loads(paymos_snapshot(state)) == {
        "kind": "withdrawal", "snapshot": applied(state), "parked": 1, "noted": False,
        "emitted": ["paymos:wd_1:payout_completed:0", "paymos:wd_1:payout_reopened:0", "paymos:wd_1:payout_failed:1"]}


def test_paymos_a_parked_change_waits_through_a_reorg_that_does_not_reach_it() -> None:
    # two parked changes, both newer than the reorg: the oldest applies, the next is parked again
    _, out = paymos_run([event("invoice.expired", "inv_1", "expired", 100),
                         event("invoice.paid", "inv_1", "paid", 300),
                         event("invoice.cancelled", "inv_1", "cancelled", 400),
                         event("invoice.awaiting_payment", "inv_1", "awaiting_payment", 200)])
    assert [(d.delivery_id, d.outcome) for d in out] == [("dlv_0", "applied"), ("dlv_1", "parked"),
                                                         ("dlv_2", "parked"), ("dlv_3", "applied"),
                                                         ("dlv_1", "unparked")]
    assert [e.dedupe_key for d in out for e in d.effects] == ["paymos:inv_1:invoice_expired", "paymos:inv_1:credit"]


def test_paymos_a_kind_change_is_quarantined_and_a_late_payment_notes_its_closing_status() -> None:
    state, out = paymos_run([event("invoice.expired", "inv_1", "expired", 300),
                             event("withdrawal.completed", "inv_1", "completed", 400),
                             event("invoice.paid_late", "inv_1", "expired", 500, paid_late_at=1_796_000_000)])
    assert [(d.outcome, d.error) for d in out] == [("applied", None), ("quarantined", "object kind changed"),
                                                   ("applied", None)]
    assert out[1].event_type == "withdrawal.completed" and out[1].payload is not None
    body = "paid in full after closing as expired (paid_late_at 1796000000)"
    assert [(f.kind, f.key, f.data) for f in out[2].facts] == [
        ("order_note", "paymos:inv_1:paid_late",
         {"note_key": "paymos:inv_1:paid_late", "resource_id": "inv_1", "kind": "paid_late", "body": body})]
    assert [(e.dedupe_key, e.type, e.gateway, e.resource_id, e.payload, e.caused_by) for e in out[2].effects] == [
        ("paymos:inv_1:add_order_note", "add_order_note", "paymos", "inv_1", {"invoice_id": "inv_1", "note": body},
         "dlv_2")]
    assert out[2].payload is not None and out[2].event_id == "evt_inv_1_invoice.paid_late_500"
    assert (state.kind, state.noted) == ("invoice", True)


# --- card: one delivery's decisions, field by field (apply_event) -----------------------------

def _card(eid: str, kind: str, second: int, amount: int, sequence: int | None, currency: str | None) -> bytes:
    return orjson.dumps({"id": eid, "type": f"payment.{kind}", "payment_ref": "pay:1", "sequence": sequence,
                         "occurred_at": f"2026-11-29T10:02:{second:02d}.123Z", "amount_minor": amount,
                         "currency": currency})


def _card_run(bodies: list[bytes]) -> tuple[CardState, list[dict[str, Any]]]:
    state: CardState | None = None
    out: list[dict[str, Any]] = []
    for n, raw in enumerate(bodies):
        w = card_read(raw, True)
        assert isinstance(w, CardWebhook), w
        state, made = card_apply(state, w, Delivery(f"d{n}", "card", "card:pay:1", 1000 + n, 9 + n))
        out += [orjson.loads(m.to_bytes()) for m in made]
    assert state is not None
    return state, out


def test_card_the_event_that_frees_a_parked_one_writes_row_facts_effect_and_the_unparked_delivery() -> None:
    capture, auth = _card("c1", "captured", 5, 100, 2, None), _card("a1", "authorised", 1, 100, 1, "EUR")
    state, out = _card_run([capture, auth, auth])
    first = {"delivery_id": "d0", "gateway": "card", "resource_id": "pay:1", "outcome": "parked",
             "received_at_ms": 1000, "seq": 1, "event_id": "c1", "event_type": "payment.captured", "sequence": 2,
             "row": None, "table": None, "effects": [], "payload": orjson.loads(capture), "error": None,
             "facts": [{"kind": "card_event", "key": "c1", "data": {
                 "gateway_event_id": "c1", "payment_ref": "pay:1", "event_type": "payment.captured", "sequence": 2,
                 "occurred_at": "2026-11-29T10:02:05.123000+00:00", "received_at": "1970-01-01T00:00:01+00:00",
                 "payload": capture.decode(), "source": "webhook"}}]}
    at = "1970-01-01T00:00:01.001000+00:00"
    applied = {"delivery_id": "d1", "gateway": "card", "resource_id": "pay:1", "outcome": "applied",
               "received_at_ms": 1001, "seq": 2, "event_id": "a1", "event_type": "payment.authorised", "sequence": 1,
               "row": {"payment_ref": "pay:1", "state": "captured", "authorised_minor": 100, "captured_minor": 100,
                       "refunded_minor": 0, "currency": "EUR", "version": 2},
               "table": "card_payments", "payload": orjson.loads(auth), "error": None,
               "effects": [{"dedupe_key": "card:pay:1:mark_order_paid", "type": "mark_order_paid", "gateway": "card",
                            "resource_id": "pay:1", "caused_by": "d1",
                            "payload": {"payment_ref": "pay:1", "state": "captured", "captured_minor": 100,
                                        "refunded_minor": 0}}],
               "facts": [{"kind": "card_event", "key": "a1", "data": {
                   "gateway_event_id": "a1", "payment_ref": "pay:1", "event_type": "payment.authorised",
                   "sequence": 1, "occurred_at": "2026-11-29T10:02:01.123000+00:00", "received_at": at,
                   "payload": auth.decode(), "source": "webhook"}},
                   {"kind": "card_event_applied", "key": "c1", "data": {"gateway_event_id": "c1", "applied_at": at}},
                   {"kind": "card_event_applied", "key": "a1", "data": {"gateway_event_id": "a1", "applied_at": at}}]}
    unparked = {"delivery_id": "d0", "gateway": "card", "resource_id": "pay:1", "outcome": "unparked",
                "received_at_ms": 1000, "seq": 3, "event_id": "c1", "event_type": "payment.captured", "sequence": 2,
                "row": None, "table": None, "effects": [], "facts": [], "payload": None, "error": None}
    duplicate = {"delivery_id": "d2", "gateway": "card", "resource_id": "pay:1", "outcome": "duplicate",
                 "received_at_ms": 1002, "seq": 4, "event_id": "a1", "event_type": "payment.authorised",
                 "sequence": 1, "row": None, "table": None, "effects": [], "facts": [],
                 "payload": orjson.loads(auth), "error": None}
    assert out == [first, applied, unparked, duplicate]
    assert orjson.loads(card_snapshot(state)) == {"applied": ["a1", "c1"], "events": 2,
                                                  "emitted": ["mark_order_paid"], "parked": 0}


def test_card_an_event_without_a_currency_keeps_the_payments() -> None:
    state, out = _card_run([_card("a1", "authorised", 1, 100, None, "EUR"),
                            _card("c1", "captured", 2, 40, None, None)])
    assert state.currency == "EUR" and out[-1]["row"]["currency"] == "EUR"
    assert out[-1]["row"]["version"] == 2 and out[-1]["row"]["captured_minor"] == 40


# --- card: where a synced answer sits among sequenced events (covered_upto) -------------------

def _answer(at: int, state: str, captured: int = 0, refunded: int = 0) -> CardEvent:
    return CardEvent(f"sync_{state}", "synced", at, synced=Synced(state, 100, captured, refunded))


def _seq(kind: str, sequence: int, amount: int = 0, at: int = 0) -> CardEvent:
    return CardEvent(f"e{sequence}", kind, at, amount, sequence)


def test_card_an_answer_covers_events_until_one_its_totals_or_state_cannot_hold() -> None:
    auth, cap = _seq("authorised", 1), _seq("captured", 2, 60)
    assert covered_upto(_answer(0, "captured", 60), [auth, cap]) == 2
    assert covered_upto(_answer(0, "created"), [auth, cap]) == 0  # it says created: not even authorised
    assert covered_upto(_answer(0, "authorised"), [auth, cap]) == 1  # the capture is above its 0 captured
    refunds = [auth, cap, _seq("refunded", 3, 30), _seq("refunded", 4, 30)]
    assert covered_upto(_answer(0, "captured", 60, 40), refunds) == 3  # refunds add up: 60 > 40
    assert covered_upto(_answer(0, "captured", 60, 60), refunds) == 4
    voided = [auth, _seq("voided", 2)]
    assert covered_upto(_answer(0, "authorised"), voided) == 1 and covered_upto(_answer(0, "voided"), voided) == 2


def test_card_after_a_gap_the_fetch_moment_decides_and_without_one_the_clock_is_not_read() -> None:
    answer = _answer(1_000, "captured", 60)
    late_but_next = [_seq("authorised", 1, at=5_000), _seq("captured", 2, 60, at=6_000)]
    assert covered_upto(answer, late_but_next) == 2  # no gap: stamped after the fetch, covered all the same
    after_a_gap = [_seq("authorised", 1), _seq("captured", 3, 60, at=1_001)]
    assert covered_upto(answer, after_a_gap) == 1  # sequence 2 missing, stamped after the fetch
    assert covered_upto(answer, [_seq("authorised", 1), _seq("captured", 3, 60, at=1_000)]) == 3  # at it
    assert covered_upto(answer, [_seq("authorised", 1), _seq("captured", 4, 60, at=1_001)]) == 1
    # a sequence may start at 0: the answer sits after 0, not after a 1 it never covered
    assert covered_upto(_answer(0, "authorised"), [_seq("authorised", 0), _seq("captured", 1, 60)]) == 0


def test_paymos_a_status_outside_the_machine_ranks_with_the_middle_ones_on_a_tie() -> None:
    # rank 1 (as confirming, signed): a tie with it is stale, a rank-2 status at the same time is newer
    _, out = paymos_run([event("invoice.confirming", "inv_1", "confirming", 100),
                         event("invoice.updated", "inv_1", "on_hold", 100),
                         event("invoice.underpaid_waiting", "inv_1", "underpaid_waiting", 100),
                         event("invoice.updated", "inv_1", "on_review", 200),
                         event("invoice.confirming", "inv_1", "confirming", 200, event_id="again")])
    assert [d.outcome for d in out] == ["applied", "stale", "applied", "applied", "stale"]


# --- card: the ordering key (ordering_key) ----------------------------------------------------

def test_card_sequences_order_even_from_zero_and_ties_on_one_go_by_rank_then_id() -> None:
    # sequence 0 holds the authorisation and a void, sequence 1 a capture: voided, the capture waits
    # (were 0 read as 1, the capture, rank 1 like the void but first by id, would go before it)
    out = reduce([CardEvent("e0", "authorised", 0, 100, 0), CardEvent("z", "voided", 0, 0, 0),
                  CardEvent("a", "captured", 0, 60, 1)])
    assert (out.state, out.applied, out.parked) == ("voided", ["e0", "z"], ["a"])
    # the sequence decides against the ids: the capture (2) applies, the void (3) after it waits
    later = reduce([_seq("authorised", 1, 100), CardEvent("b", "captured", 0, 60, 2),
                    CardEvent("a", "voided", 0, 0, 3)])
    assert (later.state, later.applied, later.parked) == ("captured", ["e1", "b"], ["a"])


def test_card_one_event_without_a_sequence_orders_them_all_by_clock_and_an_answer_sits_by_what_it_covers() -> None:
    # a webhook without a sequence among sequenced ones: the clock orders all (the capture first: parked)
    mixed = reduce([_seq("authorised", 2, 100, at=5), CardEvent("c", "captured", 1, 100)])
    assert (mixed.applied, mixed.parked) == (["e2", "c"], [])
    assert ordering_key([_seq("authorised", 2, 100, at=5), CardEvent("c", "captured", 1, 100)])(
        CardEvent("c", "captured", 1, 100)) == (1, 1, 0, "c")
    # an answer without a sequence sits after the events it covers, whatever its clock says
    events = [_seq("authorised", 1, 100, at=10), _seq("captured", 2, 60, at=20), _answer(0, "authorised")]
    key = ordering_key(events)
    assert [e.id for e in sorted(events, key=key)] == ["e1", "sync_authorised", "e2"]
    assert key(events[1]) == (2, 1, 0, "e2") and key(events[2]) == (1, 4, 0, "sync_authorised")


def test_card_events_of_one_sequence_go_by_rank_wherever_the_key_is_read() -> None:
    # a capture and a refund both at sequence 2: the capture (rank 1) first, whatever their ids say
    tie = [_seq("authorised", 0, 100), CardEvent("c1", "captured", 0, 50, 1),
           CardEvent("b", "captured", 0, 50, 2), CardEvent("a", "refunded", 0, 50, 2)]
    out = reduce(tie)
    assert (out.state, out.captured_minor, out.refunded_minor, out.parked) == ("captured", 100, 50, [])
    # with an answer stored: the refund is above the answer's 0 refunded, the tied capture is not
    answer = _answer(0, "captured", 100)
    key = ordering_key([*tie, answer])
    assert key(answer)[:2] == (2, 4)  # covers the capture b at 2, then stops at the refund a


def test_card_an_answer_is_placed_by_the_sequence_order_not_the_ids_and_an_empty_one_first() -> None:
    events = [_seq("authorised", 1, 100), CardEvent("b", "captured", 0, 60, 2), CardEvent("a", "captured", 0, 40, 3)]
    answer = _answer(0, "captured", 60)
    assert ordering_key([*events, answer])(answer)[:2] == (2, 4)  # after b (60), before a (would be 100)
    # an event at sequence 0 before an answer that covers it, and a first answer without totals before all
    zero = [_seq("authorised", 0, 100), _answer(0, "authorised")]
    key = ordering_key(zero)
    assert key(zero[0]) < key(zero[1])
    empty = CardEvent("s", "synced", 0)
    assert ordering_key([*events, empty])(empty)[:2] == (0, 4)
    # covered in sequence order: the capture at 0 is covered, then the authorisation at 1
    odd = [CardEvent("c", "captured", 0, 60, 0), CardEvent("x", "authorised", 0, 100, 1)]
    assert covered_upto(_answer(0, "captured", 60), odd) == 1
    assert ordering_key([*odd, _answer(0, "captured", 60)])(_answer(0, "captured", 60))[:2] == (1, 4)


def test_card_a_refund_of_one_minor_unit_of_one_captured_is_a_full_refund() -> None:
    out = reduce([_seq("authorised", 1, 1), _seq("captured", 2, 1), _seq("refunded", 3, 1)])
    assert (out.state, out.refunded_minor) == ("refunded", 1)


def test_paymos_each_rewind_opens_a_new_cycle_of_completion_keys() -> None:
    _, out = paymos_run([event("withdrawal.completed", "wd_1", "completed", 100),
                         event("withdrawal.completion_rewound", "wd_1", "processing", 200),
                         event("withdrawal.completed", "wd_1", "completed", 300, event_id="c2"),
                         event("withdrawal.completion_rewound", "wd_1", "processing", 400, event_id="r2"),
                         event("withdrawal.completed", "wd_1", "completed", 500, event_id="c3")], key="paymos:wd_1")
    assert [e.dedupe_key for d in out for e in d.effects] == [
        "paymos:wd_1:payout_completed:0", "paymos:wd_1:payout_reopened:0", "paymos:wd_1:payout_completed:1",
        "paymos:wd_1:payout_reopened:1", "paymos:wd_1:payout_completed:2"]


# --- pg: the correlation's own decisions (apply_correlation) ----------------------------------

PG_CORR = {"pg_deposit_id": "dep_1", "merchant_reference": "mr_1", "our_order_id": "ord_1", "our_user_id": "usr_1"}


def test_pg_a_second_correlation_that_differs_is_quarantined_with_what_it_said() -> None:
    first = Delivery("c1", "pg", "pg:dep_1", 1, 0)
    state, _ = pg_correlate(None, Correlation(**PG_CORR), first)
    other = {**PG_CORR, "our_order_id": "ord_2"}
    state, (decision,) = pg_correlate(state, Correlation(**other), Delivery("c2", "pg", "pg:dep_1", 7, 1))
    assert (decision.delivery_id, decision.outcome, decision.received_at_ms, decision.seq) == \
        ("c2", "quarantined", 7, 2)
    assert (decision.error, decision.event_type, decision.payload) == (
        "conflicting correlation for this deposit", "correlation.registered", other)
    assert state.correlation == Correlation(**PG_CORR)


def test_pg_a_parked_event_that_no_longer_reads_is_set_aside_alone_and_the_state_kept() -> None:
    parked = PgParked(deposit("dep_1", 3, "settled").decode(), Delivery("w1", "pg", "pg:dep_1", 5, 0))
    broken = PgParked('{"not": "a deposit"}', Delivery("w0", "pg", "pg:dep_1", 4, 1))
    state = PgState(parked=[broken, parked])
    state, out = pg_correlate(state, Correlation(**PG_CORR), Delivery("c1", "pg", "pg:dep_1", 6, 2))
    assert [(d.delivery_id, d.outcome) for d in out] == [("c1", "applied"), ("w0", "quarantined"), ("w1", "unparked")]
    assert out[1].received_at_ms == 4
    assert out[1].error == \
        "parked event could not be applied: Invalid: data.object.object: unknown object kind 'None'"
    assert state.version == 3 and state.parked == [] and state.correlation == Correlation(**PG_CORR)


def test_pg_a_parked_event_of_another_object_is_set_aside_naming_it() -> None:
    other = PgParked(withdrawal("wdr_1", 2, "completed", 1_000_000).decode(), Delivery("w0", "pg", "pg:dep_1", 4, 0))
    _, out = pg_correlate(PgState(parked=[other]), Correlation(**PG_CORR), Delivery("c1", "pg", "pg:dep_1", 6, 1))
    assert out[1].error == "parked event could not be applied: Invalid: a parked withdrawal event"


def test_pg_a_parked_events_error_is_cut_at_five_hundred_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(raw: bytes, checked: bool) -> object:
        raise ValueError("x" * 600)

    monkeypatch.setattr(pg_core, "read", unreadable)  # what no adapter says today: the cut is a bound
    parked = PgParked(deposit("dep_1", 3, "settled").decode(), Delivery("w0", "pg", "pg:dep_1", 4, 0))
    _, out = pg_correlate(PgState(parked=[parked]), Correlation(**PG_CORR), Delivery("c1", "pg", "pg:dep_1", 6, 1))
    prefix = "parked event could not be applied: ValueError: "
    assert out[1].error == prefix + "x" * (500 - len(prefix))
