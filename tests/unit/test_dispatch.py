"""The worker's fault barrier (app/core/dispatch.py): a record the core cannot handle is set aside
with its reason, its resource's state stays as it was, and every other record is decided exactly
as if it had never been in the batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.dispatch import BatchPlan, Incoming, plan_batch
from app.gateways.registry import GATEWAYS
from tests.pg_events import deposit
from topics.catalog import names
from topics.records import CHECKED, correlation_headers, raw_headers

N = names("t")


def correlation(dep: str) -> Incoming:
    body = orjson.dumps({"pg_deposit_id": dep, "merchant_reference": f"mr_{dep}", "our_order_id": f"o_{dep}",
                         "our_user_id": f"u_{dep}"})
    return Incoming(f"pg:{dep}".encode(), body, correlation_headers("pg", f"c_{dep}", 1_700_000_000_000), 0, 0, N.raw)


def webhook(gateway: str, resource: str, body: bytes, delivery: str, checked: bool = True) -> Incoming:
    """A raw record; ``checked``: it came through the ingest's typed validation (here, to reach the
    core with what only a bug could let through)."""
    headers = raw_headers(gateway, delivery, 1_700_000_000_000) + ([CHECKED] if checked else [])
    return Incoming(f"{gateway}:{resource}".encode(), body, headers, 0, 0, N.raw)


def card(ref: str, amount: int, event_id: str) -> bytes:
    return orjson.dumps({"id": event_id, "type": "payment.captured", "payment_ref": ref, "sequence": None,
                         "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": amount, "currency": "EUR"})


# Records the core itself cannot handle (typed validation at the ingest keeps them out of the log;
# these stand for whatever still reaches the worker: an older log, a bug, a redrive).
POISON: dict[str, Callable[[str], bytes]] = {
    "review is a string": lambda dep: deposit(dep, 4, "under_review", review="not an object"),
    "correlation not json": lambda dep: b"\xff not json",
}


def numbered(batch: list[Incoming]) -> list[Incoming]:
    return [Incoming(r.key, r.value, r.headers, offset, r.partition, r.topic) for offset, r in enumerate(batch)]


def outputs(plan: BatchPlan, topic: str) -> list[tuple[bytes, Any]]:
    return [(r[1], orjson.loads(r[2])) for records in plan.records.values() for r in records if r[0] == topic]


def test_a_record_the_core_cannot_handle_is_set_aside_and_the_batch_goes_on() -> None:
    batch = numbered([correlation("dep_a"), webhook("pg", "dep_a", deposit("dep_a", 3, "settled"), "d1"),
                      webhook("pg", "dep_a", POISON["review is a string"]("dep_a"), "d2"),
                      webhook("pg", "dep_a", deposit("dep_a", 5, "reversed"), "d3")])
    plan = plan_batch(N, GATEWAYS, batch, lambda partition, key: None)
    # the worker reads it with the schema (what the ingest's check would have said): refused
    assert [reason for _, reason in plan.set_aside] == [
        "Refused: data.object.review: expected object | null, got str"]
    quarantined = [r for records in plan.records.values() for r in records if r[0] == N.quarantine]
    assert len(quarantined) == 1 and quarantined[0][1] == b"d2" and quarantined[0][2] == batch[2].value
    headers = dict(quarantined[0][3])  # type: ignore[misc]
    assert headers["stage"] == b"worker" and headers["resource_key"] == b"pg:dep_a"
    assert b"review" in headers["reason"]
    timeline = {d["delivery_id"]: (d["outcome"], d["error"]) for _, d in outputs(plan, N.decisions)}
    assert timeline["d1"][0] == "applied" and timeline["d3"][0] == "applied"
    assert timeline["d2"][0] == "quarantined" and "review" in timeline["d2"][1]
    kinds = [e["type"] for _, e in outputs(plan, N.effects)]
    assert kinds == ["credit_user", "release_goods", "debit_user", "hold_goods"]
    state = orjson.loads(plan.states[b"pg:dep_a"])
    assert state["version"] == 5 and "evt_dep_a_v4" not in state["seen"]  # nothing of d2 applied


def test_a_set_aside_record_leaves_the_stored_state_as_it_was() -> None:
    first = plan_batch(N, GATEWAYS, numbered([correlation("dep_s"),
                                              webhook("pg", "dep_s", deposit("dep_s", 3, "settled"), "d1")]),
                       lambda p, k: None)
    stored = first.states[b"pg:dep_s"]
    plan = plan_batch(N, GATEWAYS, [webhook("pg", "dep_s", POISON["review is a string"]("dep_s"), "d2")],
                      lambda partition, key: stored)
    assert plan.states == {} and len(plan.set_aside) == 1  # no new state: the stored one stands


def test_state_over_the_limit_is_set_aside() -> None:
    padding = "x" * 6_000
    batch = numbered([webhook("pg", "dep_p", deposit("dep_p", v, "pending", padding=padding), f"d{v}")
                      for v in range(1, 6)])  # parked: no correlation yet, so the state grows
    # states of 20,000 bytes at most
    plan = plan_batch(N, GATEWAYS, batch, lambda partition, key: None, topic_max_bytes=40_000)
    assert len(plan.set_aside) == 2 and all("state would be" in reason for _, reason in plan.set_aside)
    assert len(orjson.loads(plan.states[b"pg:dep_p"])["parked"]) == 3


def test_captures_whose_sum_passes_64_bits_are_set_aside() -> None:
    """The issue's card example, at the largest amount the schema takes (2**63 - 1): the third
    capture's total passes what orjson writes (64 bits unsigned); its decision cannot be written."""
    most = 2**63 - 1
    auth = orjson.dumps({"id": "a1", "type": "payment.authorised", "payment_ref": "pay_x", "sequence": None,
                         "occurred_at": "2026-11-29T10:02:15.000Z", "amount_minor": most, "currency": "EUR"})
    batch = numbered([webhook("card", "pay_x", auth, "d0"),
                      *(webhook("card", "pay_x", card("pay_x", most, f"e{i}"), f"d{i}") for i in (1, 2, 3))])
    plan = plan_batch(N, GATEWAYS, batch, lambda partition, key: None)
    assert [reason for _, reason in plan.set_aside] == ["TypeError: Integer exceeds 64-bit range"]
    assert [d["outcome"] for _, d in outputs(plan, N.decisions)] == ["applied", "applied", "applied", "quarantined"]


GOOD = [
    lambda i: webhook("pg", f"dep_{i}", deposit(f"dep_{i}", 3, "settled"), f"g{i}a"),
    lambda i: webhook("pg", f"dep_{i % 2}", deposit(f"dep_{i % 2}", 10 + i, "settled"), f"g{i}b"),
    lambda i: correlation(f"dep_{i % 3}"),
    lambda i: webhook("card", f"pay_{i % 2}", card(f"pay_{i % 2}", 100 + i, f"evt_c{i}"), f"g{i}c"),
]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.sampled_from(sorted(POISON))), min_size=1,
                max_size=12))
def test_every_other_record_is_decided_as_without_the_poison(plan_spec: list[tuple[bool, int, str]]) -> None:
    """The careful pass decides the good records exactly as a batch without the bad ones would."""
    batch = []
    for i, (bad, kind, poison) in enumerate(plan_spec):
        if bad:
            resource = f"dep_{i % 3}"
            record = webhook("pg", resource, POISON[poison](resource), f"bad{i}")
            if poison == "correlation not json":
                record = Incoming(record.key, record.value, correlation_headers("pg", f"bad{i}", 1), 0, 0, N.raw)
            batch.append(record)
        else:
            batch.append(GOOD[kind](i))
    batch = numbered(batch)  # each record keeps its offset in both runs
    good = [record for record, (bad, _, _) in zip(batch, plan_spec, strict=True) if not bad]
    with_poison = plan_batch(N, GATEWAYS, batch, lambda partition, key: None)
    without = plan_batch(N, GATEWAYS, good, lambda partition, key: None)
    assert len(with_poison.set_aside) <= sum(bad for bad, _, _ in plan_spec)
    never_applied = {d["delivery_id"]: d["outcome"] for _, d in outputs(with_poison, N.decisions)
                     if str(d["delivery_id"]).startswith("bad")}
    assert not set(never_applied.values()) & {"applied", "unparked"}

    def kept(plan: BatchPlan, topic: str) -> list[Any]:
        found = [value for _, value in outputs(plan, topic)]
        if topic == N.decisions:  # ordinals and offsets differ where a record was left out
            found = [{k: v for k, v in d.items() if k not in ("seq",)} for d in found
                     if not str(d["delivery_id"]).startswith("bad")]
        return found

    for topic in (N.effects, N.facts, N.decisions):
        assert kept(with_poison, topic) == kept(without, topic)
    # a bad record may wait parked in its resource's state; every other resource's state is the same
    touched = {record.key for record, (bad, _, _) in zip(batch, plan_spec, strict=True) if bad}
    assert {k: _no_ordinals(v) for k, v in with_poison.states.items() if k not in touched} == \
        {k: _no_ordinals(v) for k, v in without.states.items() if k not in touched}


def _no_ordinals(state: bytes) -> Any:
    decoded = orjson.loads(state)
    decoded.pop("n", None)
    decoded.pop("_recent", None)
    return decoded


def test_a_raw_record_that_did_not_pass_the_ingest_is_checked_by_its_adapter_first() -> None:
    """An older log or a direct append: the worker applies the same typed check, so no state holds
    what DESIGN.md §2.4 refuses; the record is set aside with the adapter's reason."""
    batch = numbered([correlation("dep_u"),
                      webhook("pg", "dep_u", POISON["review is a string"]("dep_u"), "d1", checked=False),
                      webhook("pg", "dep_u", deposit("dep_u", 3, "settled"), "d2", checked=False)])
    plan = plan_batch(N, GATEWAYS, batch, lambda partition, key: None)
    assert [reason for _, reason in plan.set_aside] == [
        "Refused: data.object.review: expected object | null, got str"]
    assert orjson.loads(plan.states[b"pg:dep_u"])["version"] == 3  # the valid one applied


@pytest.mark.parametrize("received_at", [b"abc", b"\xff", b"-5", b"1" + b"0" * 30, b"253402300800000"])
def test_a_received_at_that_is_no_time_is_set_aside_with_its_reason_and_the_batch_goes_on(received_at: bytes) -> None:
    """A record appended to orderly.raw some other way than through the ingest may carry anything in
    its received_at header; planning its batch must never raise (the worker would loop on it)."""
    odd = webhook("card", "pay_o", card("pay_o", 500, "e_odd"), "d_odd")
    odd = Incoming(odd.key, odd.value, [(k, received_at if k == "received_at" else v) for k, v in odd.headers],
                   0, 0, N.raw)
    batch = numbered([odd, webhook("card", "pay_p", card("pay_p", 700, "e_ok"), "d_ok")])
    plan = plan_batch(N, GATEWAYS, batch, lambda partition, key: None)
    assert [(gateway, reason.split(":")[0]) for gateway, reason in plan.set_aside] == [("card", "ValueError")]
    quarantined = [value for topic, _key, value, *_ in plan.records[0] if topic == N.quarantine]
    assert quarantined == [odd.value]  # the body as it came; its headers keep the odd value
    decided = {key: d["outcome"] for key, d in outputs(plan, N.decisions)}
    assert decided == {b"card:pay_o": "quarantined", b"card:pay_p": "parked"}
    assert next(d for key, d in outputs(plan, N.decisions) if key == b"card:pay_o")["received_at_ms"] == 0


def deep(body: bytes, levels: int) -> bytes:
    """``body`` with an unknown field nested ``levels`` arrays deep (gateways add fields)."""
    return body[:-1] + b',"x_deep":' + b"[" * levels + b"]" * levels + b"}"


# (the ingest's mark, forged, or none: a record the fetcher might write; levels; set aside)
@pytest.mark.parametrize(("marked", "levels", "refused"), [
    (False, 40, True), (False, 1021, True), (True, 251, True), (True, 1021, True),
    (True, 40, False),  # a mark below NEST_MAX is trusted: the ingest checked the body
])
def test_a_body_nested_past_the_ingests_depth_is_set_aside_and_its_resource_goes_on(marked: bool, levels: int,
                                                                                   refused: bool) -> None:
    """The decisions and a parked paymos body carry the body's bytes as they are: one the ingest did
    not mark and nested past its depth, or one nested past what could be read back whatever its
    headers say, is set aside (a parked body 1,021 levels deep made the next batch's state unreadable)."""
    from tests.paymos_events import event

    def record(body: bytes, delivery: str) -> Incoming:
        headers = [*raw_headers("paymos", delivery, 1_700_000_000_000, "webhook" if marked else "fetch"),
                   *([CHECKED] if marked else [])]
        return Incoming(b"paymos:inv_1", body, headers, 0, 0, N.raw)

    store: dict[bytes, bytes] = {}
    at = 1_733_000_000_000
    paid = record(event("invoice.paid", "inv_1", "paid", at), "d1")
    waiting = record(deep(event("invoice.confirming", "inv_1", "confirming", at + 1), levels), "d2")
    plan = plan_batch(N, GATEWAYS, numbered([paid, waiting]), lambda partition, key: store.get(key))
    store.update(plan.states)
    reasons = [reason for _, reason in plan.set_aside]
    if not refused:
        assert reasons == [] and [d["outcome"] for _, d in outputs(plan, N.decisions)] == ["applied", "parked"]
        return
    (reason,) = reasons
    assert reason.startswith("Refused: ") and reason.endswith("JSON nests deeper than 32")
    later = record(event("invoice.paid_late", "inv_1", "paid", at + 2, paid_late_at=at // 1000), "d3")
    plan = plan_batch(N, GATEWAYS, numbered([later]), lambda partition, key: store.get(key))
    assert plan.set_aside == [] and [d["outcome"] for _, d in outputs(plan, N.decisions)] == ["applied"]


def test_an_integer_past_64_bits_in_a_body_the_ingest_did_not_mark_is_set_aside() -> None:
    """A fetcher's or a direct append's body with an integer orjson reads as a float: carried as its
    bytes, a consumer would read the integer and PostgreSQL could not store it."""
    body = card("pay_b", 500, "e_big")[:-1] + b',"x_big":123456789012345678901234567890}'
    odd = Incoming(b"card:pay_b", body, raw_headers("card", "d_big", 1_700_000_000_000, "fetch"), 0, 0, N.raw)
    plan = plan_batch(N, GATEWAYS, numbered([odd]), lambda partition, key: None)
    assert [reason for _, reason in plan.set_aside] == ["Refused: x_big: integer outside the signed 64-bit range"]


def with_headers(record: Incoming, **changed: bytes | None) -> Incoming:
    headers = [(k, changed.pop(k) if k in changed else v) for k, v in record.headers] + list(changed.items())
    return Incoming(record.key, record.value, headers, record.offset, record.partition, record.topic)  # type: ignore[arg-type]


@pytest.mark.parametrize(("case", "outcome"), [
    ("a header with a null value", "parked"), ("a delivery id that is not UTF-8", "parked"),
    ("no key", "quarantined"), ("a stored state that is a list", "quarantined"),
    ("a stored state that is null", "quarantined"), ("a stored state that is no JSON", "quarantined"),
])
def test_a_record_appended_some_other_way_never_makes_planning_raise(case: str, outcome: str) -> None:
    """Kafka allows a null header value and a null key, and a damaged changelog may hold anything: the
    batch is planned whatever they are (the worker would loop on a batch that raises), and its other
    records are decided."""
    odd = webhook("card", "pay_o", card("pay_o", 500, "e_odd"), "d_odd")
    stored: bytes | None = None
    if case == "a header with a null value":
        odd = with_headers(odd, x_trace=None)
    elif case == "a delivery id that is not UTF-8":
        odd = with_headers(odd, delivery_id=b"\xff\xfe")
    elif case == "no key":
        odd = Incoming(None, odd.value, odd.headers, 0, 0, N.raw)  # type: ignore[arg-type]
    else:
        stored = {"a stored state that is a list": b"[]", "a stored state that is null": b"null",
                  "a stored state that is no JSON": b"\x00"}[case]
    good = webhook("card", "pay_g", card("pay_g", 700, "e_ok"), "d_ok")
    plan = plan_batch(N, GATEWAYS, numbered([odd, good]), lambda partition, key: stored if key == odd.key else None)
    decided = [(key, d["outcome"]) for key, d in outputs(plan, N.decisions)]
    assert decided == [(odd.key or b"", outcome), (b"card:pay_g", "parked")]
    assert len(plan.set_aside) == (outcome == "quarantined")


def test_a_keyless_record_without_a_gateway_header_and_a_state_at_the_largest_ordinal_is_set_aside() -> None:
    """The reason's gateway then comes from nowhere, and the stored ordinal cannot be counted on: the
    record is still set aside (the worker would loop on a batch that raises)."""
    odd = Incoming(None, b"{}", [("delivery_id", b"d_k")], 0, 0, N.raw)  # type: ignore[arg-type]
    plan = plan_batch(N, GATEWAYS, [odd], lambda partition, key: None)
    assert [gateway for gateway, _ in plan.set_aside] == [""]
    damaged = webhook("card", "pay_d", card("pay_d", 5, "e_d"), "d_d")
    plan = plan_batch(N, GATEWAYS, [damaged], lambda partition, key: b'{"n": 18446744073709551615}')
    assert len(plan.set_aside) == 1 and [d["seq"] for _, d in outputs(plan, N.decisions)] == [1]
