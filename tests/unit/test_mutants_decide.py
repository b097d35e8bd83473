"""How the worker reads a record and which reducer decides it, and what the pg core decides for a
resource of another kind or an event seen before (killing mutmut's survivors in app/core/dispatch.py
and app/core/pg.py, docs/testing.md).

The rules: a record's headers mean what topics/records.py says (``checked: 2``, the ingest's adapter
took the body and found it JSON every reader reads; ``checked: 1``, an earlier ingest's adapter took
it; a delivery without a gateway header is its resource key's gateway); a resource key is
``gateway:resource_id`` and a resource id may itself hold a colon; a record no reducer can decide is
quarantined with the reason, never dropped (DESIGN.md §2.4); a pg resource is one object kind for
ever (../shared/gateway-docs/pg-event-order-version-guard.txt); a decision names the event it was
about (its id, type and sequence), a duplicate too.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from app.core import card as card_core
from app.core import paymos as paymos_core
from app.core import pg as pg_core
from app.core.dispatch import Incoming, decide_delivery, plan_batch
from app.core.incoming import NOT_CHECKED, SOUND, TAKEN, read_headers
from app.core.model import APPLIED, DUPLICATE, PARKED, QUARANTINED, RECENT, STALE, Delivery, decide, remember
from app.gateways import paymos
from app.gateways.pg import Webhook, read
from app.gateways.registry import GATEWAYS
from tests import paymos_events
from tests.pg_events import balance_txn, deposit, withdrawal
from topics.catalog import names
from topics.records import CHECKED, Correlation, raw_headers

RAW = names("t")


# --- read_headers: the ingest's five headers and anything else that has five ---

def ingest_headers() -> list[tuple[str, bytes]]:
    return [*raw_headers("card", "dlv_9", 1_700_000_000_123, "fetch"), CHECKED]


def test_the_ingest_s_headers_are_read_as_written() -> None:
    delivery, correlation, checked = read_headers(Incoming(b"pg:dep_1", b"{}", ingest_headers(), 7, 2, "t.raw"))
    assert delivery == Delivery("dlv_9", "card", "pg:dep_1", 1_700_000_000_123, 7, "fetch")
    assert (correlation, checked) == (False, SOUND)


@pytest.mark.parametrize("position", range(5))
def test_five_headers_one_of_another_name_are_read_by_their_names(position: int) -> None:
    headers = ingest_headers()
    headers[position] = ("x-trace", headers[position][1])
    delivery, correlation, checked = read_headers(Incoming(b"pg:dep_1", b"{}", headers, 7, 2, "t.raw"))
    # the header left out takes its default: the key's gateway, the record's place, 0, a webhook, unchecked
    expected = {"gateway": "card", "delivery_id": "dlv_9", "received_at_ms": 1_700_000_000_123, "source": "fetch"}
    defaults = [("gateway", "pg"), ("delivery_id", "t.raw:2:7"), ("received_at_ms", 0), ("source", "webhook")]
    if position < 4:
        expected.update([defaults[position]])
    assert {name: getattr(delivery, name) for name in expected} == expected
    assert checked == (SOUND if position != 4 else NOT_CHECKED) and correlation is False


def test_checked_counts_in_any_order() -> None:
    headers = [CHECKED, *raw_headers("pg", "dlv_1", 5)]
    assert read_headers(Incoming(b"pg:dep_1", b"{}", headers, 0, 0, "t.raw"))[2] == SOUND
    headers = [*raw_headers("pg", "dlv_1", 5), ("record", b"x"), CHECKED]
    assert read_headers(Incoming(b"pg:dep_1", b"{}", headers, 0, 0, "t.raw"))[2] == SOUND
    # an earlier release's mark, in the ingest's place or another: taken, not proven sound
    for headers in ([*raw_headers("pg", "dlv_1", 5), ("checked", b"1")],
                    [("checked", b"1"), *raw_headers("pg", "dlv_1", 5)]):
        assert read_headers(Incoming(b"pg:dep_1", b"{}", headers, 0, 0, "t.raw"))[2] == TAKEN
    headers = [*raw_headers("pg", "dlv_1", 5), ("checked", b"3")]
    assert read_headers(Incoming(b"pg:dep_1", b"{}", headers, 0, 0, "t.raw"))[2] == NOT_CHECKED


# --- decide_delivery: what no reducer can decide is quarantined, saying why ---

@pytest.mark.parametrize("gateway, correlation, named", [
    ("card", True, "correlation"),  # a correlation for a gateway that takes none
    ("nope", False, "'nope'"),  # a delivery of a gateway no reducer decides
])
def test_what_no_reducer_can_decide_is_quarantined_saying_why(gateway: str, correlation: bool, named: str) -> None:
    delivery = Delivery("dlv_1", gateway, f"{gateway}:x_1", 5, 3)
    state, decisions = decide_delivery(GATEWAYS, None, b"{}", delivery, correlation, SOUND)
    assert state is None and len(decisions) == 1
    decision = decisions[0]
    assert (decision.delivery_id, decision.gateway, decision.resource_id, decision.outcome) == (
        "dlv_1", gateway, "x_1", QUARANTINED)
    assert decision.error is not None and f"'{gateway}'" in decision.error and named in decision.error


# --- reducer_of: a resource id with a colon keeps its stored state ---

def test_a_resource_id_with_a_colon_is_decided_on_its_stored_state() -> None:
    body = deposit("dep:1", 1, "pending")
    record = Incoming(b"pg:dep:1", body, [*raw_headers("pg", "dlv_1", 5), CHECKED], 0, 0, RAW.raw)
    first = plan_batch(RAW, GATEWAYS, [record], lambda partition, key: None)
    assert first.set_aside == [] and set(first.states) == {b"pg:dep:1"}
    # the same event in another delivery, in a later batch: the stored state has seen it
    later = Incoming(b"pg:dep:1", body, [*raw_headers("pg", "dlv_2", 6), CHECKED], 1, 0, RAW.raw)
    again = plan_batch(RAW, GATEWAYS, [later], lambda partition, key: first.states.get(key))
    outcomes = [orjson.loads(r[2])["outcome"] for r in again.records[0] if r[0] == RAW.decisions]
    assert outcomes == [DUPLICATE]


# --- the pg core: one object kind per resource; a duplicate names its event ---

def webhook(raw: bytes) -> Webhook:
    found = read(raw, checked=True)
    assert isinstance(found, Webhook), found
    return found


def test_an_event_of_another_object_kind_on_a_resource_is_quarantined() -> None:
    d1 = Delivery("dlv_1", "pg", "pg:obj_1", 1, 0)
    state, _ = pg_core.apply_event(None, webhook(deposit("obj_1", 1, "pending")), d1)
    other = webhook(withdrawal("obj_1", 1, "pending", 0, event_id="evt_w"))
    d2 = Delivery("dlv_2", "pg", "pg:obj_1", 2, 1)
    state, decisions = pg_core.apply_event(state, other, d2)
    assert len(decisions) == 1
    decision = decisions[0]
    assert (decision.delivery_id, decision.outcome) == ("dlv_2", QUARANTINED)
    assert decision.error is not None and "withdrawal" in decision.error and "deposit" in decision.error
    assert (decision.event_id, decision.event_type, decision.sequence) == (
        other.event.id, other.event.type, other.event.sequence)
    assert orjson.dumps(decision.payload) == other.raw


def test_a_duplicate_names_its_event() -> None:
    event = webhook(deposit("dep_1", 1, "pending", event_id="evt_a"))
    state, _ = pg_core.apply_event(None, event, Delivery("dlv_1", "pg", "pg:dep_1", 1, 0))
    state, decisions = pg_core.apply_event(state, event, Delivery("dlv_2", "pg", "pg:dep_1", 2, 1))
    assert len(decisions) == 1
    decision = decisions[0]
    assert (decision.delivery_id, decision.outcome) == ("dlv_2", DUPLICATE)
    assert (decision.event_id, decision.event_type, decision.sequence) == ("evt_a", "deposit.pending", 1)
    assert orjson.dumps(decision.payload) == event.raw


def correlated(deposit_id: str = "dep_1") -> pg_core.State:
    state, _ = pg_core.apply_correlation(None, Correlation(deposit_id, "mr_1", "ord_1", "usr_1"),
                                         Delivery("dlv_c", "pg", f"pg:{deposit_id}", 1, 0))
    return state


@pytest.mark.parametrize("partial", [True, False, None])
def test_goods_released_as_partial_only_when_the_deposit_says_partial_true(partial: bool | None) -> None:
    # the guide's handler: release_goods { partial: o.partial === true, ... }
    extra: dict[str, Any] = {} if partial is None else {"partial": partial}
    raw = deposit("dep_1", 1, "settled", **extra)
    _, decisions = pg_core.apply_event(correlated(), webhook(raw), Delivery("dlv_1", "pg", "pg:dep_1", 2, 1))
    released = [e.payload for d in decisions for e in d.effects if e.type == "release_goods"]
    assert len(released) == 1 and isinstance(released[0], dict)
    assert released[0]["partial"] is (partial is True)


def test_a_stale_event_still_carries_its_overpayment_flag_s_error() -> None:
    # a flag that breaks the documented shape is not stored, and the decision says so, stale or not
    state = correlated()
    state, _ = pg_core.apply_event(state, webhook(deposit("dep_1", 2, "pending")),
                                   Delivery("dlv_2", "pg", "pg:dep_1", 2, 1))
    flag = {"claim_id": "clm_1", "cause": "not_a_cause", "amount_minor": 5, "status": "open",
            "action_required": "contact_support", "slip_received_at": "2026-11-29T10:33:15Z"}
    old = webhook(deposit("dep_1", 1, "pending", overpayment=flag))
    _, decisions = pg_core.apply_event(state, old, Delivery("dlv_1", "pg", "pg:dep_1", 3, 2))
    assert [d.outcome for d in decisions] == [STALE]
    assert decisions[0].error is not None and "clm_1" in decisions[0].error


# --- the recent deliveries a state remembers (model.RECENT) ---

def test_a_state_given_a_new_list_remembers_the_last_recent_deliveries() -> None:
    before: list[Any] = [(f"dlv_{i}", [(f"dlv_{i}", "applied", i, None, None)]) for i in range(RECENT)]
    after = SimpleNamespace(recent=[])  # a reducer that built its state anew: not ``before``'s list
    delivery = Delivery(f"dlv_{RECENT}", "pg", "pg:dep_1", 5, 3)
    remember(before, after, delivery, [decide(delivery, DUPLICATE)])
    assert [trigger for trigger, _ in after.recent] == [f"dlv_{i}" for i in range(1, RECENT + 1)]
    assert len(before) == RECENT  # the other state's own list is left as it was


# --- the card reducer: a capture before its authorisation waits, nothing authorised yet ---

def test_a_capture_alone_waits_and_nothing_is_authorised() -> None:
    assert card_core.reduce([]) == card_core.Reduced("created", 0, 0, 0, [], [])
    alone = card_core.reduce([card_core.CardEvent("evt_1", "captured", 1, 500)])
    assert alone == card_core.Reduced("created", 0, 0, 0, [], ["evt_1"])


def test_a_key_that_is_not_utf8_is_set_aside_saying_so() -> None:
    record = Incoming(b"\xff:x", deposit("dep_1", 1, "pending"), [*raw_headers("pg", "dlv_1", 5), CHECKED],
                      0, 0, RAW.raw)
    plan = plan_batch(RAW, GATEWAYS, [record], lambda partition, key: None)
    assert len(plan.set_aside) == 1
    gateway, reason = plan.set_aside[0]
    assert gateway == "pg" and "utf-8" in reason.lower(), reason


# --- paymos: a parked snapshot no newer than the one its reorg brought is stale, as if delivered now ---

def test_a_parked_snapshot_that_ties_the_reorg_s_is_stale() -> None:
    first = 1_764_412_395_000

    def snapshot(event_type: str, status: str, at: int, event_id: str) -> paymos.Webhook:
        found = paymos.read(paymos_events.event(event_type, "inv_1", status, at, event_id), True)
        assert isinstance(found, paymos.Webhook), found
        return found

    log = [snapshot("invoice.paid", "paid", first + 100, "evt_0"),
           snapshot("invoice.confirming", "awaiting_payment", first + 200, "evt_1"),  # after a terminal state
           snapshot("invoice.awaiting_payment", "awaiting_payment", first + 200, "evt_2")]  # the reorg, same key
    state: paymos_core.State | None = None
    outcomes = []
    for i, w in enumerate(log):
        state, decisions = paymos_core.apply_event(state, w, Delivery(f"dlv_{i}", "paymos", "paymos:inv_1", i, i))
        outcomes += [(d.delivery_id, d.outcome) for d in decisions]
    assert outcomes == [("dlv_0", APPLIED), ("dlv_1", PARKED), ("dlv_2", APPLIED), ("dlv_1", STALE)]


def test_a_record_past_half_the_topics_limit_is_set_aside_naming_that_half_in_bytes() -> None:
    record = Incoming(b"pg:dep_1", deposit("dep_1", 1, "pending"), [*raw_headers("pg", "dlv_1", 5), CHECKED],
                      0, 0, RAW.raw)
    plan = plan_batch(RAW, GATEWAYS, [record], lambda partition, key: None, topic_max_bytes=201)
    assert len(plan.set_aside) == 1
    assert "(at most 100)" in plan.set_aside[0][1], plan.set_aside


def test_a_balance_transaction_again_under_another_event_is_a_duplicate_naming_that_event() -> None:
    # a balance transaction is immutable: one row per btxn id, whatever event brings it again
    first = webhook(balance_txn("btxn_1", 500, event_id="evt_a"))
    state, _ = pg_core.apply_event(None, first, Delivery("dlv_1", "pg", "pg:btxn_1", 1, 0))
    again = webhook(balance_txn("btxn_1", 500, event_id="evt_b", sequence=2))
    state, decisions = pg_core.apply_event(state, again, Delivery("dlv_2", "pg", "pg:btxn_1", 2, 1))
    assert [(d.delivery_id, d.outcome) for d in decisions] == [("dlv_2", DUPLICATE)]
    assert (decisions[0].event_id, decisions[0].event_type, decisions[0].sequence) == (
        "evt_b", "balance_transaction.created", 2)
    assert orjson.dumps(decisions[0].payload) == again.raw
