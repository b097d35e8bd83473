"""The pg version guard as pure decisions: the document's cases, parking, and properties."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.dispatch import Incoming, plan_batch
from app.core.model import Decision, Delivery
from app.core.pg import Invalid, State, apply_correlation, apply_event, check_deposit_money
from app.gateways.base import Route
from app.gateways.pg import Deposit, Webhook, read
from app.gateways.registry import GATEWAYS
from tests.pg_events import AMOUNT, balance_txn, deposit, withdrawal
from tests.pg_truth import deposit_truth
from topics.catalog import names
from topics.records import CHECKED, Correlation, correlation_headers, raw_headers

RAW = names("t")
CORR = {"pg_deposit_id": "dep_1", "merchant_reference": "mr_1", "our_order_id": "ord_1", "our_user_id": "usr_1"}
def run_log(log: list[tuple[int, bytes | dict[str, Any]]], key: str = "pg:dep_1"
            ) -> tuple[State, list[Decision]]:
    """Decide (n, event or correlation) in order, each with delivery id dlv_n and arrival time n
    wherever it stands in the log."""
    state: State | None = None
    out: list[Decision] = []
    for position, (n, ev) in enumerate(log):
        delivery = Delivery(f"dlv_{n}", "pg", key, 1_700_000_000_000 + n, position)
        if isinstance(ev, dict):
            state, decisions = apply_correlation(state, Correlation(**ev), delivery)
        else:
            webhook = read(ev, checked=True)  # the adapter's one read, as the worker does
            assert isinstance(webhook, Webhook), webhook
            state, decisions = apply_event(state, webhook, delivery)
        out += decisions
    assert state is not None
    return state, out


def run(events: list[bytes | dict[str, Any]], key: str = "pg:dep_1") -> tuple[State, list[Decision]]:
    return run_log(list(enumerate(events)), key)


def applied(state: State) -> Any:
    """The last applied data.object, as stored."""
    return orjson.loads(memoryview(state.object))


def effects(decisions: list[Decision]) -> list[str]:
    return [e.dedupe_key for d in decisions for e in d.effects]


def balance(decisions: list[Decision]) -> int:
    total = 0
    for d in decisions:
        for e in d.effects:
            if e.type == "credit_user":
                total += e.payload["amount_minor"]
            elif e.type == "debit_user":
                total -= e.payload["amount_minor"]
    return total


def test_case_a_expired_after_settled_changes_nothing() -> None:
    state, out = run([CORR, deposit("dep_1", 7, "slip_received"), deposit("dep_1", 9, "settled"),
                      deposit("dep_1", 6, "expired")])
    assert [d.outcome for d in out] == ["applied", "applied", "applied", "stale"]
    assert applied(state)["status"] == "settled" and state.version == 9
    assert out[-1].effects == [] and out[-1].row is None
    assert balance(out) == AMOUNT


def test_case_b_settled_after_reversed_credits_nothing() -> None:
    state, out = run([CORR, deposit("dep_1", 12, "reversed"), deposit("dep_1", 9, "settled")])
    assert [d.outcome for d in out] == ["applied", "applied", "stale"]
    assert applied(state)["status"] == "reversed"
    assert balance(out) == 0 and not any(e.endswith("release_goods") for e in effects(out))
    # reversed without a prior credit debits nothing either
    assert not any(e.endswith("debit_user") for e in effects(out))


def test_settled_then_reversed_credits_once_and_debits_once() -> None:
    _, out = run([CORR, deposit("dep_1", 9, "settled"), deposit("dep_1", 12, "reversed"),
                  deposit("dep_1", 9, "settled", event_id="evt_redelivered_fresh_id")])
    assert effects(out) == ["deposit:dep_1:credit_user", "deposit:dep_1:release_goods",
                            "deposit:dep_1:debit_user", "deposit:dep_1:hold_goods"]
    assert balance(out) == 0


def test_credit_uses_amount_received_not_credited_amount() -> None:
    _, out = run([CORR, deposit("dep_1", 9, "settled")])
    credit = next(e for d in out for e in d.effects if e.type == "credit_user")
    assert credit.payload == {"user_id": "usr_1", "order_id": "ord_1", "amount_minor": AMOUNT}
    release = next(e for d in out for e in d.effects if e.type == "release_goods")
    assert release.payload == {"order_id": "ord_1", "partial": False, "received": AMOUNT, "ordered": AMOUNT}


def test_case_c_fills_out_of_order_keep_the_highest_totals() -> None:
    fills: list[bytes | dict[str, Any]] = [
             withdrawal("wdr_1", 9, "filling", 700_000, fill={"leg_ref": "leg_2", "amount_minor": 300_000}),
             withdrawal("wdr_1", 11, "settled", 1_000_000, fill={"leg_ref": "leg_3", "amount_minor": 300_000}),
             withdrawal("wdr_1", 7, "filling", 400_000, fill={"leg_ref": "leg_1", "amount_minor": 400_000})]
    state, out = run(fills, key="pg:wdr_1")
    assert [d.outcome for d in out] == ["applied", "applied", "stale"]
    assert applied(state)["remaining_minor"] == 0
    # every fill row is appended, the stale one included
    assert [f.key for d in out for f in d.facts] == ["leg_2", "leg_3", "leg_1"]
    assert effects(out) == ["withdrawal:wdr_1:close_payout"]
    assert out[1].row is not None and out[1].row["remaining_minor"] == 0


def test_withdrawal_does_not_close_on_first_fill_or_twice() -> None:
    _, out = run([withdrawal("wdr_1", 3, "filling", 400_000),
                  withdrawal("wdr_1", 5, "settled", 1_000_000),
                  withdrawal("wdr_1", 6, "settled", 1_000_000)], key="pg:wdr_1")
    assert effects(out) == ["withdrawal:wdr_1:close_payout"]


def test_withdrawal_equal_version_under_a_fresh_event_id_is_stale() -> None:
    # the guard is "greater than": the same version redelivered under another event id is not a
    # duplicate (the id differs) but stale, and its totals never overwrite the applied ones
    _, out = run([withdrawal("wdr_1", 5, "filling", 400_000),
                  withdrawal("wdr_1", 5, "filling", 100_000, event_id="evt_wdr_1_again")], key="pg:wdr_1")
    assert [d.outcome for d in out] == ["applied", "stale"]
    assert out[-1].row is None and out[-1].effects == []


def test_attribute_only_update_applies_without_a_second_credit() -> None:
    _, out = run([CORR, deposit("dep_1", 9, "settled"), deposit("dep_1", 10, "settled", note="attr change")])
    assert [d.outcome for d in out] == ["applied", "applied", "applied"]
    assert out[2].row is not None and out[2].row["pg_version"] == 10
    assert out[2].effects == []


def test_late_slip_after_expiry_shows_slip_then_settles() -> None:
    _, out = run([CORR, deposit("dep_1", 6, "expired"), deposit("dep_1", 9, "settled")])
    assert [e.type for d in out for e in d.effects] == ["show_late_slip", "credit_user", "release_goods"]
    _, out = run([CORR, deposit("dep_1", 6, "expired", is_terminal=True)])
    assert [e.type for d in out for e in d.effects] == ["fail_order"]


def test_switch_branches() -> None:
    _, out = run([CORR, deposit("dep_1", 2, "under_review"), deposit("dep_1", 3, "rejected",
                  rejection={"display_th": "ปฏิเสธ"}), deposit("dep_1", 4, "brand_new_status")])
    kinds = [(e.type, e.payload) for d in out for e in d.effects]
    assert kinds == [("show_pending_review", {"order_id": "ord_1", "message": "กำลังตรวจสอบ"}),
                     ("fail_order", {"order_id": "ord_1", "reason": "ปฏิเสธ"}),
                     ("update_order_status", {"order_id": "ord_1", "status": "brand_new_status"})]
    assert all(k.startswith("evt_") for k in effects(out))  # snapshot effects are keyed on the event


def test_overpayment_flag_from_a_stale_event_is_still_kept() -> None:
    flag = {"claim_id": "clm_1", "cause": "same_transfer_excess", "amount_minor": 2000,
            "slip_received_at": "2026-11-29T10:30:00Z", "status": "open", "action_required": "contact_support"}
    _, out = run([CORR, deposit("dep_1", 12, "reversed"), deposit("dep_1", 11, "settled", overpayment=flag)])
    assert out[-1].outcome == "stale" and [f.key for f in out[-1].facts] == ["clm_1"]
    assert out[-1].facts[0].data["observed_deposit_version"] == 11
    collision = {**flag, "amount_minor": 9999}
    _, out = run([CORR, deposit("dep_1", 11, "settled", overpayment=flag),
                  deposit("dep_1", 13, "settled", overpayment=collision)])
    assert out[-1].error is not None and "collision" in out[-1].error and out[-1].facts == []


def test_webhook_before_correlation_is_parked_then_applied() -> None:
    state, out = run([deposit("dep_1", 6, "expired"), deposit("dep_1", 9, "settled"), CORR])
    assert [d.outcome for d in out] == ["parked", "parked", "applied", "unparked", "unparked"]
    assert state.parked == [] and state.version == 9
    # released in log order, as if the correlation had come first: the expiry, then the settlement
    assert [e.type for d in out for e in d.effects] == ["show_late_slip", "credit_user", "release_goods"]
    assert [d.delivery_id for d in out[3:]] == ["dlv_0", "dlv_1"] and out[3].seq > out[1].seq


def test_late_correlation_of_a_settled_then_reversed_deposit_credits_then_debits() -> None:
    """The race of issue #22: both webhooks logged before the correlation. The merchant receives
    what it would have received with the correlation first: credit, release, debit, hold."""
    state, out = run([deposit("dep_1", 5, "settled"), deposit("dep_1", 8, "reversed"), CORR])
    assert [e.type for d in out for e in d.effects] == ["credit_user", "release_goods", "debit_user", "hold_goods"]
    assert applied(state)["status"] == "reversed" and balance(out) == 0


def test_metadata_is_never_used_for_the_user() -> None:
    _, out = run([CORR, deposit("dep_1", 9, "settled")])
    assert all(e.payload.get("user_id") in (None, "usr_1") for d in out for e in d.effects)


def test_duplicates_and_invalid_input() -> None:
    ev = deposit("dep_1", 9, "settled")
    _, out = run([CORR, ev, ev])
    assert [d.outcome for d in out] == ["applied", "applied", "duplicate"]
    bad = orjson.loads(deposit("dep_1", 9, "settled"))
    bad["data"]["object"]["amount_received_minor"] = 12.5  # money is never a float: the schema refuses it
    refused = read(orjson.dumps(bad), checked=True)
    assert isinstance(refused, Route) and "expected int" in (refused.quarantine_reason or "")
    bad["data"]["object"]["amount_received_minor"] = AMOUNT + 1  # breaks pg_deposit_money_ck
    bad["id"] = "evt_other"
    _, out = run([CORR, orjson.dumps(bad)])
    assert out[-1].outcome == "quarantined" and "money" in (out[-1].error or "")


def test_balance_transactions_dedupe_on_id() -> None:
    _, out = run([balance_txn("btxn_1", 5000), balance_txn("btxn_1", 5000, event_id="evt_again")], key="pg:btxn_1")
    assert [d.outcome for d in out] == ["applied", "duplicate"]


# --- properties -------------------------------------------------------------------------------

LIFECYCLES = [
    ["pending", "slip_received", "settled"],
    ["pending", "expired", "slip_received", "settled"],          # Case A's late slip
    ["pending", "slip_received", "settled", "reversed"],         # Case B
    ["pending", "under_review", "settled"],
    ["pending", "expired"],
    ["pending", "slip_received", "rejected"],
    ["pending", "settled", "settled", "reversed"],               # attribute-only update in between
]


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[str], list[bytes | dict[str, Any]]]:
    statuses = draw(st.sampled_from(LIFECYCLES))
    versions = sorted(draw(st.lists(st.integers(1, 1000), min_size=len(statuses), max_size=len(statuses),
                                    unique=True)))
    events: list[bytes | dict[str, Any]] = [deposit("dep_1", v, s) for v, s in zip(versions, statuses, strict=True)]
    events.append(CORR)
    dupes = draw(st.lists(st.sampled_from(events), max_size=4))
    order = draw(st.permutations(events + dupes))
    return statuses, list(order)


@settings(max_examples=400)
@given(deliveries())
def test_any_order_with_duplicates_ends_in_the_gateways_final_state(case: tuple[list[str], list[Any]]) -> None:
    statuses, order = case
    state, out = run(order)
    final = max((orjson.loads(e) for e in order if isinstance(e, bytes)), key=lambda b: b["data"]["object"]["version"])
    assert applied(state) == final["data"]["object"]
    keys = effects(out)
    assert len(keys) == len(set(keys)), "an effect was emitted twice"
    # exactly what the gateway's document derives from the webhooks in log order (tests/pg_truth.py)
    derived = deposit_truth([e for e in order if isinstance(e, bytes)])
    assert keys == derived.effects
    assert {e.dedupe_key: e.payload["amount_minor"] * (-1 if e.type == "debit_user" else 1)
            for d in out for e in d.effects if e.type in ("credit_user", "debit_user")} == derived.ledger
    # one-shot effects at most once; the user's balance equals the truth
    truth = AMOUNT if final["data"]["object"]["status"] == "settled" else 0
    assert balance(out) == truth
    counts = Counter(k.rsplit(":", 1)[1] for k in keys if k.startswith("deposit:"))
    assert all(c == 1 for c in counts.values())
    if statuses[-1] == "settled":
        assert counts["credit_user"] == 1 and counts["release_goods"] == 1
    # every delivery got exactly one final outcome; a duplicate never emits anything
    assert all(not d.effects for d in out if d.outcome in ("duplicate", "stale", "parked"))


@settings(max_examples=200)
@given(st.permutations(list(range(3))), st.lists(st.integers(0, 2), max_size=3))
def test_any_order_of_fills_ends_at_the_final_totals(order: list[int], dupes: list[int]) -> None:
    fills = [withdrawal("wdr_1", 7, "filling", 400_000, fill={"leg_ref": "leg_1", "amount_minor": 400_000}),
             withdrawal("wdr_1", 9, "filling", 700_000, fill={"leg_ref": "leg_2", "amount_minor": 300_000}),
             withdrawal("wdr_1", 11, "settled", 1_000_000, fill={"leg_ref": "leg_3", "amount_minor": 300_000})]
    state, out = run([fills[i] for i in order + dupes], key="pg:wdr_1")
    assert (applied(state)["filled_minor"], applied(state)["remaining_minor"]) == (1_000_000, 0)
    assert effects(out) == ["withdrawal:wdr_1:close_payout"]
    assert {f.key for d in out for f in d.facts} == {"leg_1", "leg_2", "leg_3"}


def as_records(order: list[bytes | dict[str, Any]], dep: str) -> list[Incoming]:
    """``order`` as the worker consumes it from orderly.raw, for deposit ``dep`` (the bodies and the
    correlation rewritten from dep_1), each record with a delivery id and arrival time of its own."""
    records = []
    for i, ev in enumerate(order):
        if isinstance(ev, dict):
            body = orjson.dumps({**ev, "pg_deposit_id": dep, "merchant_reference": f"mr_{dep}",
                                 "our_order_id": f"ord_{dep}", "our_user_id": f"usr_{dep}"})
            headers = correlation_headers("pg", f"{dep}_c{i}", 1_700_000_000_000 + i)
        else:
            body = ev.replace(b"dep_1", dep.encode())
            headers = [*raw_headers("pg", f"{dep}_d{i}", 1_700_000_000_000 + i), CHECKED]
        records.append(Incoming(f"pg:{dep}".encode(), body, headers, 0, 0, RAW.raw))
    return records


@settings(max_examples=150, deadline=None)
@given(deliveries(), deliveries(), st.data())
def test_one_batch_decides_as_record_by_record_and_as_the_reducer_alone(
        first: tuple[list[str], list[Any]], second: tuple[list[str], list[Any]], data: st.DataObject) -> None:
    """Three paths to the same decisions: the worker's batch planner (app/core/dispatch.plan_batch)
    over the whole log in one batch, which keeps each resource's state in memory between its
    records; the same log cut into batches at random points, each batch reading the state the
    previous one stored (serialised, as after a restart or a rebalance); and the reducer alone, one
    deposit at a time. Two deposits' records are interleaved, so one resource's state must never
    leak into the other's."""
    lanes = [as_records(first[1], "dep_1"), as_records(second[1], "dep_2")]
    log: list[Incoming] = []
    for lane in data.draw(st.permutations([0] * len(lanes[0]) + [1] * len(lanes[1]))):
        log.append(lanes[lane].pop(0))
    log = [Incoming(r.key, r.value, r.headers, offset, r.partition, r.topic) for offset, r in enumerate(log)]
    cuts = sorted(data.draw(st.sets(st.integers(1, len(log) - 1), max_size=len(log))))

    def decided(records: list[Any]) -> list[tuple[str, bytes, Any]]:
        # orderly.state is written once per resource per batch: compared through the stored states
        return [(r[0], r[1], orjson.loads(r[2])) for r in records if r[0] != RAW.state]

    whole = plan_batch(RAW, GATEWAYS, log, lambda partition, key: None)
    store: dict[bytes, bytes] = {}
    pieces: list[Any] = []
    for start, end in zip([0, *cuts], [*cuts, len(log)], strict=True):
        plan = plan_batch(RAW, GATEWAYS, log[start:end], lambda partition, key: store.get(key))
        assert plan.set_aside == []
        store.update(plan.states)
        pieces += decided(plan.records.get(0, []))
    assert whole.set_aside == []
    assert pieces == decided(whole.records[0])
    assert {k: orjson.loads(v) for k, v in store.items()} == {k: orjson.loads(v) for k, v in whole.states.items()}

    # and the reducer by itself, deposit by deposit, emits the same effects (delivery ids aside)
    for dep, (_, order) in (("dep_1", first), ("dep_2", second)):
        _, alone = run(order)
        expected = [(e.dedupe_key.replace("dep_1", dep), e.type, e.payload) for d in alone for e in d.effects]
        got = [(v["dedupe_key"], v["type"], v["payload"]) for topic, key, v in pieces
               if topic == RAW.effects and v["resource_id"] == dep]
        assert [k for k, _, _ in got] == [k for k, _, _ in expected]
        assert [t for _, t, _ in got] == [t for _, t, _ in expected]
        assert [p.get("amount_minor") for _, _, p in got] == [p.get("amount_minor") for _, _, p in expected]


def without_ordinals(state: State) -> State:
    return msgspec.structs.replace(state, n=0)  # parked deliveries take ordinals of their own


@settings(max_examples=400)
@given(st.sampled_from(LIFECYCLES), st.data())
def test_when_the_correlation_comes_changes_no_effect(statuses: list[str], data: st.DataObject) -> None:
    """The same webhooks in the same log order give the same effects, facts, ledger and state
    wherever the correlation stands among them: releasing parked events in log order decides them
    as if the correlation had come first (issue #22)."""
    versions = data.draw(st.lists(st.integers(1, 1000), min_size=len(statuses), max_size=len(statuses), unique=True))
    events: list[bytes | dict[str, Any]] = [deposit("dep_1", v, s) for v, s in zip(sorted(versions), statuses,
                                                                                    strict=True)]
    events += data.draw(st.lists(st.sampled_from(events), max_size=3))
    webhooks = list(enumerate(data.draw(st.permutations(events)), start=1))
    at = data.draw(st.integers(0, len(webhooks)))
    first_state, first = run_log([(0, CORR), *webhooks])
    late_state, late = run_log([*webhooks[:at], (0, CORR), *webhooks[at:]])
    assert [e.to_dict() for d in late for e in d.effects] == [e.to_dict() for d in first for e in d.effects]
    assert [(f.kind, f.key) for d in late for f in d.facts] == [(f.kind, f.key) for d in first for f in d.facts]
    assert without_ordinals(late_state) == without_ordinals(first_state)
    assert balance(late) == balance(first)
    # every webhook parked before the correlation is released, in the order it was logged
    assert {d.outcome for d in late[:at]} <= {"parked", "duplicate"} and late[at].outcome == "applied"
    parked = [d.delivery_id for d in late[:at] if d.outcome == "parked"]
    assert [d.delivery_id for d in late[at + 1:at + 1 + len(parked)]] == parked


MONEY = ("ordered_amount_minor", "transferred_amount_minor", "amount_received_minor", "fee_total_minor",
         "credited_amount_minor")


def money_ck(status: str, amounts: dict[str, int | None]) -> bool:
    """pg_deposit_money_ck as projections/migrations/0001_pg_gateway.sql states it."""
    if status not in ("settled", "reversed"):
        return True
    ordered, transferred, received, fee, credited = (amounts[name] for name in MONEY)
    if ordered is None or transferred is None or received is None or fee is None or credited is None:
        return False
    return (ordered > 0 and transferred > 0 and received > 0 and received == min(transferred, ordered)
            and 0 <= fee <= received and received - fee == credited)


def test_a_deposit_is_refused_before_storing_exactly_when_the_tables_money_check_would_refuse_it() -> None:
    # every combination of missing, zero and small amounts: each clause's edge is among them
    for status in ("settled", "reversed", "pending", "expired"):
        for values in itertools.product((None, 0, 1, 2), repeat=len(MONEY)):
            amounts = dict(zip(MONEY, values, strict=True))
            obj = msgspec.convert({"id": "dep_1", "object": "deposit", "version": 1, "status": status, **amounts},
                                  Deposit)
            missing = next((name for name in MONEY if amounts[name] is None), None)
            if money_ck(status, amounts):
                check_deposit_money(obj)
                continue
            expected = "amounts break pg_deposit_money_ck" if missing is None else \
                f"{missing} must be an integer, got None"
            with pytest.raises(Invalid) as refused:
                check_deposit_money(obj)
            assert str(refused.value) == expected, (status, amounts)


FLAG = {"claim_id": "clm_1", "cause": "same_transfer_excess", "amount_minor": 1,
        "slip_received_at": "2026-11-29T10:30:00Z", "status": "open", "action_required": "contact_support"}
NOT_STORED = "overpayment flag clm_1 does not match the documented shape; not stored"


def test_an_overpayment_flag_is_appended_once_as_the_flags_table_takes_it_and_any_other_shape_is_named() -> None:
    # the shape pg_deposit_overpayment_flags' CHECKs take (gateway-docs/pg-event-order-version-guard.txt)
    for flag in (FLAG, {**FLAG, "cause": "additional_transfer", "amount_minor": 2_000}):
        state, out = run([CORR, deposit("dep_1", 11, "settled", overpayment=flag)])
        assert (out[-1].outcome, out[-1].error) == ("applied", None)
        assert [(f.kind, f.key, f.data) for f in out[-1].facts] == [("overpayment_flag", "clm_1", {
            "claim_id": "clm_1", "pg_deposit_id": "dep_1", "observed_deposit_version": 11, "flag": flag})]
        assert orjson.loads(memoryview(state.claims["clm_1"])) == flag
    # one field off the documented shape: the deposit applies, the flag is refused by name
    for changed in ({"cause": "typo"}, {"amount_minor": 0}, {"amount_minor": None}, {"status": "closed"},
                    {"action_required": "wait"}, {"slip_received_at": None}):
        state, out = run([CORR, deposit("dep_1", 11, "settled", overpayment={**FLAG, **changed})])
        assert (out[-1].outcome, out[-1].error, out[-1].facts, state.claims) == ("applied", NOT_STORED, [], {}), changed
    # no claim: nothing to append, nothing to say
    _, out = run([CORR, deposit("dep_1", 11, "settled", overpayment={**FLAG, "claim_id": None})])
    assert (out[-1].error, out[-1].facts) == (None, [])


def test_the_same_overpayment_flag_seen_again_in_another_field_order_is_no_collision() -> None:
    again = dict(reversed(FLAG.items()))
    state, out = run([CORR, deposit("dep_1", 11, "settled", overpayment=FLAG),
                      deposit("dep_1", 12, "reversed", overpayment=again)])
    assert out[-1].error is None and [f.data["observed_deposit_version"] for f in out[-1].facts] == [12]
    # the first flag stays, the colliding one is named and not appended
    state, out = run([CORR, deposit("dep_1", 11, "settled", overpayment=FLAG),
                  deposit("dep_1", 12, "reversed", overpayment={**FLAG, "amount_minor": 2})])
    collision = "overpayment claim_id clm_1 collision: immutable flag content differs"
    assert (out[-1].error, out[-1].facts) == (collision, [])
    assert orjson.loads(memoryview(state.claims["clm_1"])) == FLAG


def test_a_deposit_row_holds_each_pg_deposits_column_from_the_snapshot_the_correlation_and_the_effects() -> None:
    fees = [{"kind": "gateway", "amount_minor": 2_500}]
    extra: dict[str, Any] = {"fee_breakdown": fees, "overpayment": FLAG, "balance_transaction_id": "btxn_1",
             "clearing_available_at": "2026-11-30T00:00:00Z"}
    _, out = run([CORR, deposit("dep_1", 5, "settled", **extra), deposit("dep_1", 8, "reversed", **extra)])
    credited, reversed_ = "2023-11-14T22:13:20.001000+00:00", "2023-11-14T22:13:20.002000+00:00"
    assert out[-1].table == "pg_deposits" and out[-1].row == {
        "pg_deposit_id": "dep_1", "pg_version": 8, "status": "reversed", "is_terminal": None,
        "late_slip_accepted_until": None, "ordered_amount_minor": AMOUNT, "transferred_amount_minor": AMOUNT,
        "amount_received_minor": AMOUNT, "fee_total_minor": 2_500, "credited_amount_minor": AMOUNT - 2_500,
        "fee_breakdown": fees, "overpayment": FLAG, "balance_transaction_id": "btxn_1",
        "clearing_available_at": "2026-11-30T00:00:00Z", "our_order_id": "ord_1", "our_user_id": "usr_1",
        "credited_user_at": credited, "reversed_at": reversed_}
    _, out = run([CORR, deposit("dep_1", 6, "expired")])
    assert out[-1].row is not None
    assert (out[-1].row["is_terminal"], out[-1].row["late_slip_accepted_until"]) == (False, "2026-11-30T10:04:41Z")
