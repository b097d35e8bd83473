"""paymos decisions: terminal states, reorgs, paid_late notes, decimal amounts, properties."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.model import Decision, Delivery
from app.core.paymos import State, apply_event
from app.gateways import paymos as adapter
from app.gateways.base import Route
from tests import paymos_events

T0 = 1_764_412_395_000  # updated_at is Unix milliseconds (the schema takes 2000..2100): offsets from here


def event(event_type: str, rid: str, status: str, updated_at: int, event_id: str | None = None,
          **extra: Any) -> bytes:
    return paymos_events.event(event_type, rid, status, T0 + updated_at,
                               event_id or f"evt_{rid}_{event_type}_{updated_at}", **extra)


def run(events: list[bytes], key: str = "paymos:inv_1") -> tuple[State, list[Decision]]:
    state: State | None = None
    out: list[Decision] = []
    for n, raw in enumerate(events):
        webhook = adapter.read(raw, checked=True)  # the adapter's one read, as the worker does
        assert isinstance(webhook, adapter.Webhook), webhook
        state, decisions = apply_event(state, webhook,
                                       Delivery(f"dlv_{n}", "paymos", key, 1_700_000_000_000 + n, n))
        out += decisions
    assert state is not None
    return state, out


def applied(state: State) -> Any:
    """The last applied ``data``, as stored."""
    return orjson.loads(memoryview(state.snapshot))


def effect_keys(out: list[Decision]) -> list[str]:
    return [e.dedupe_key for d in out for e in d.effects]


def test_older_snapshot_after_newer_changes_nothing() -> None:
    state, out = run([event("invoice.paid", "inv_1", "paid", 200, amount="0.5"),
                      event("invoice.confirming", "inv_1", "confirming", 100)])
    assert [d.outcome for d in out] == ["applied", "stale"]
    assert applied(state)["status"] == "paid"
    assert effect_keys(out) == ["paymos:inv_1:credit"]


def test_redelivered_terminal_event_is_a_duplicate() -> None:
    paid = event("invoice.paid", "inv_1", "paid", 200)
    _, out = run([paid, paid])
    assert [d.outcome for d in out] == ["applied", "duplicate"]
    assert effect_keys(out) == ["paymos:inv_1:credit"]


def test_state_comes_from_data_not_the_event_name() -> None:
    # an event named confirming that carries status paid is a paid invoice
    state, out = run([event("invoice.confirming", "inv_1", "paid", 200)])
    assert applied(state)["status"] == "paid" and effect_keys(out) == ["paymos:inv_1:credit"]


def test_terminal_refuses_other_transitions_but_a_reorg_reopens() -> None:
    paid = event("invoice.paid", "inv_1", "paid", 200)
    confirming = event("invoice.confirming", "inv_1", "confirming", 300)
    state, out = run([paid, confirming])
    assert [d.outcome for d in out] == ["applied", "parked"] and applied(state)["status"] == "paid"
    # the deep reorg arrives: the invoice waits for payment again, then the parked confirming applies
    state, out = run([paid, confirming, event("invoice.awaiting_payment", "inv_1", "awaiting_payment", 250),
                      event("invoice.paid", "inv_1", "paid", 400)])
    assert applied(state)["updated_at"] == T0 + 400
    assert effect_keys(out) == ["paymos:inv_1:credit"]  # credited once, whatever the detour


def test_paid_late_adds_one_note_and_changes_no_decision() -> None:
    late = event("invoice.paid_late", "inv_1", "expired", 500, paid_late_at=1_796_000_000)
    state, out = run([event("invoice.expired", "inv_1", "expired", 300), late,
                      event("invoice.paid_late", "inv_1", "expired", 600, event_id="evt_again")])
    assert [d.outcome for d in out] == ["applied", "applied", "duplicate"]
    assert applied(state)["status"] == "expired"
    assert [f.key for d in out for f in d.facts] == ["paymos:inv_1:paid_late"]
    assert effect_keys(out) == ["paymos:inv_1:invoice_expired", "paymos:inv_1:add_order_note"]
    assert not any(e.type in ("invoice_paid", "invoice_paid_over") for d in out for e in d.effects)


def test_withdrawal_rewound_reopens_and_closes_again() -> None:
    state, out = run([event("withdrawal.completed", "wdr_1", "completed", 300),
                      event("withdrawal.completion_rewound", "wdr_1", "signed", 400),
                      event("withdrawal.completed", "wdr_1", "completed", 500)], key="paymos:wdr_1")
    assert effect_keys(out) == ["paymos:wdr_1:payout_completed:0", "paymos:wdr_1:payout_reopened:0",
                                "paymos:wdr_1:payout_completed:1"]
    assert applied(state)["status"] == "completed"


def test_a_second_completion_before_its_rewind_waits_for_it() -> None:
    """The document names no "same status" exception: a terminal event ends the state machine, so a
    newer completion of a completed withdrawal implies the rewind between them and waits for it. The
    merchant hears the reopening and the second cycle's completion (a core that took the second
    completion at once sent neither: the rewind then arrived stale)."""
    state, out = run([event("withdrawal.completed", "wdr_1", "completed", 300),
                      event("withdrawal.completed", "wdr_1", "completed", 500),
                      event("withdrawal.completion_rewound", "wdr_1", "signed", 400)], key="paymos:wdr_1")
    assert [d.outcome for d in out] == ["applied", "parked", "applied", "unparked"]
    assert effect_keys(out) == ["paymos:wdr_1:payout_completed:0", "paymos:wdr_1:payout_reopened:0",
                                "paymos:wdr_1:payout_completed:1"]
    assert applied(state)["updated_at"] == T0 + 500 and state.parked == []


WITHDRAWAL_HISTORY = [("withdrawal.completed", "completed", 300), ("withdrawal.completion_rewound", "signed", 400),
                      ("withdrawal.completed", "completed", 500)]


@settings(max_examples=200)
@given(st.data())
def test_a_heard_completion_is_reopened_and_closed_again_in_any_order(data: st.DataObject) -> None:
    """Whatever the order (redeliveries included), the withdrawal ends at the second completion, each
    effect at most once, and once the first completion was heard before the rest, the merchant also
    hears the reopening and the second completion."""
    history = [event(t, "wdr_1", s, at) for t, s, at in WITHDRAWAL_HISTORY]
    order = data.draw(st.permutations(history + data.draw(st.lists(st.sampled_from(history), max_size=3))))
    state, out = run(order, key="paymos:wdr_1")
    assert (applied(state)["status"], applied(state)["updated_at"]) == ("completed", T0 + 500)
    keys = effect_keys(out)
    assert len(keys) == len(set(keys)) and state.parked == []
    if order[0] == history[0]:
        assert keys == ["paymos:wdr_1:payout_completed:0", "paymos:wdr_1:payout_reopened:0",
                        "paymos:wdr_1:payout_completed:1"]


def test_channel_deposit_confirmed_again_after_reorg_is_credited_once() -> None:
    _, out = run([event("payment_channel.deposit.confirmed", "pcd_1", "confirmed", 300, net_amount="1.25"),
                  event("payment_channel.deposit.reorged", "pcd_1", "reorged", 400),
                  event("payment_channel.deposit.confirming", "pcd_1", "confirming", 500),
                  event("payment_channel.deposit.confirmed", "pcd_1", "confirmed", 600, net_amount="1.25")],
                 key="paymos:pcd_1")
    assert effect_keys(out) == ["paymos:pcd_1:credit_channel_deposit"]
    credit = next(e for d in out for e in d.effects)
    assert credit.payload["net_amount"] == "1.25"


def test_floats_are_refused() -> None:
    refused = adapter.read(event("invoice.paid", "inv_1", "paid", 200, amount=0.5), checked=False)
    assert isinstance(refused, Route) and "decimal" in (refused.quarantine_reason or "")


INVOICE_HISTORY = [("invoice.confirming", "confirming", 100), ("invoice.paid", "paid", 200),
                   ("invoice.awaiting_payment", "awaiting_payment", 300), ("invoice.confirming", "confirming", 400),
                   ("invoice.underpaid_waiting", "underpaid_waiting", 500), ("invoice.paid_over", "paid_over", 600)]


@settings(max_examples=400)
@given(st.integers(2, len(INVOICE_HISTORY)), st.data())
def test_any_order_with_reorg_detours_ends_in_the_final_state(length: int, data: st.DataObject) -> None:
    history = [event(t, "inv_1", s, at) for t, s, at in INVOICE_HISTORY[:length]]
    order = data.draw(st.permutations(history + data.draw(st.lists(st.sampled_from(history), max_size=3))))
    state, out = run(order)
    final = INVOICE_HISTORY[length - 1]
    assert (applied(state)["status"], applied(state)["updated_at"]) == (final[1], T0 + final[2])
    keys = effect_keys(out)
    assert len(keys) == len(set(keys))  # every one-shot effect at most once
    credits = [e for d in out for e in d.effects if e.type in ("invoice_paid", "invoice_paid_over")]
    assert len(credits) <= 1  # never credited twice, whatever the detour
    if final[1] in ("paid", "paid_over"):
        assert len(credits) == 1


def test_a_field_is_an_amount_by_a_word_of_its_name_not_a_substring() -> None:
    """The document's `net` is an amount; a `network` name is not (it was refused as one before)."""
    at = 0
    body = event("invoice.paid", "inv_1", "paid", at, amount="0.5", network="tron", network_fee="0.01")
    assert adapter.route(body).resource_key == "paymos:inv_1"
    _, out = run([body])
    assert out[0].outcome == "applied"
    assert out[0].effects[0].payload == {"invoice_id": "inv_1", "status": "paid", "amount": "0.5",
                                         "network_fee": "0.01"}
    refused = adapter.route(event("invoice.paid", "inv_2", "paid", at, net_amount=5))
    assert refused.resource_key is None and "data.net_amount" in (refused.quarantine_reason or "")


def test_a_resource_parks_at_most_max_parked_snapshots_and_quarantines_the_rest() -> None:
    """Every change re-tries every parked snapshot: their number is bounded. One over the bound is
    quarantined naming the field, and its id is not kept as seen: delivered again, it is decided."""
    from app.core.paymos import MAX_PARKED
    paid = event("invoice.paid", "inv_1", "paid", 200)
    confirming = [event("invoice.confirming", "inv_1", "confirming", 300 + n) for n in range(MAX_PARKED + 3)]
    state, out = run([paid, *confirming])
    assert len(state.parked) == MAX_PARKED
    assert [d.outcome for d in out] == ["applied"] + ["parked"] * MAX_PARKED + ["quarantined"] * 3
    assert out[-1].error == f"data.id: invoice inv_1 holds {MAX_PARKED} parked snapshots, the most one keeps"
    assert out[-1].event_id == f"evt_inv_1_invoice.confirming_{300 + MAX_PARKED + 2}"
    # the reorg: the parked snapshots apply in order, and the quarantined newest, delivered again, is decided
    # (applied), not taken for a duplicate
    state, out = run([paid, *confirming, event("invoice.awaiting_payment", "inv_1", "awaiting_payment", 250),
                      confirming[-1]])
    assert [d.outcome for d in out[MAX_PARKED + 4:]] == ["applied"] + ["unparked"] * MAX_PARKED + ["applied"]
    assert applied(state)["updated_at"] == T0 + 300 + MAX_PARKED + 2 and state.parked == []
