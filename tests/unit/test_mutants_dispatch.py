"""The careful pass (a batch with a record the core cannot handle) counts, numbers and sets aside
exactly as the fast pass decides the rest (killing mutmut's survivors in app/core/dispatch.py,
docs/testing.md): counters per gateway and outcome, a delivery id made of topic, partition and
offset when the header is missing, the state read per partition, the gateway named when no
header says it, a set-aside ordinal after the stored state's, and the size limit at its edge."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest

from app.core.dispatch import BatchPlan, Incoming, Oversize, _check_size, plan_batch
from app.gateways.registry import GATEWAYS
from tests.pg_events import deposit
from tests.unit.test_dispatch import N, card, correlation, webhook
from topics.records import correlation_headers, raw_headers

POISON = deposit("dep_a", 4, "under_review", review="not an object")


def at(record: Incoming, offset: int, partition: int = 0) -> Incoming:
    return Incoming(record.key, record.value, record.headers, offset, partition, record.topic)


def no_id(record: Incoming) -> Incoming:
    """The record without its delivery_id header: its id is then topic:partition:offset."""
    return Incoming(record.key, record.value, [h for h in record.headers if h[0] != "delivery_id"],
                    record.offset, record.partition, record.topic)


def good_batch() -> list[Incoming]:
    return [at(correlation("dep_a"), 0), at(webhook("pg", "dep_a", deposit("dep_a", 3, "settled"), "d1"), 1),
            at(no_id(webhook("pg", "dep_a", deposit("dep_a", 5, "reversed"), "-")), 2),
            at(webhook("card", "pay_1", card("pay_1", 100, "e1"), "c1"), 3, partition=1),
            at(no_id(webhook("card", "pay_1", card("pay_1", 50, "e2"), "-")), 4, partition=1),
            at(correlation("dep_b"), 5), at(webhook("pg", "dep_b", deposit("dep_b", 3, "settled"), "b1"), 6),
            # card takes no correlation: a decision carrying an error, for the log
            Incoming(b"card:pay_2", b"{}", correlation_headers("card", "x1", 1), 7, 1, N.raw)]


def decisions(plan: BatchPlan) -> list[dict[str, Any]]:
    return [orjson.loads(r[2]) for records in plan.records.values() for r in records if r[0] == N.decisions]


def test_the_careful_pass_counts_and_decides_as_the_fast_pass() -> None:
    good = good_batch()
    stored = {(1, b"card:pay_1"): None}
    asked: list[tuple[int, bytes]] = []

    def read(partition: int, key: bytes) -> bytes | None:
        asked.append((partition, key))
        return stored.get((partition, key))

    fast = plan_batch(N, GATEWAYS, good, read)
    # two poison records, neither with a gateway header: their gateway is read from the key
    poison = [Incoming(b"pg:dep_a", POISON, [], 7, 0, N.raw), Incoming(b"pg:dep_a", POISON, [], 8, 0, N.raw)]
    asked.clear()
    careful = plan_batch(N, GATEWAYS, [*good, *(at(p, p.offset + 1) for p in poison)], read)
    assert (0, b"pg:dep_a") in asked and (1, b"card:pay_1") in asked and all(p in (0, 1) for p, _ in asked)
    assert careful.outcomes == fast.outcomes + Counter({("pg", "quarantined"): 2})
    assert fast.outcomes[("pg", "applied")] == 5 and sum(v for (g, _), v in fast.outcomes.items() if g == "card") == 3
    assert careful.effects == fast.effects
    assert fast.effects[("pg", "credit_user")] == fast.effects[("pg", "release_goods")] == 2
    assert careful.errors == fast.errors
    assert [(d.resource_id, d.error) for d in fast.errors] == [("pay_2", "gateway 'card' takes no correlation")]
    assert careful.last == fast.last == {b"pg:dep_a": 2, b"card:pay_1": 4, b"pg:dep_b": 6, b"card:pay_2": 7}
    assert careful.states == fast.states
    assert [(g, r.split(":")[0]) for g, r in careful.set_aside] == [("pg", "Refused"), ("pg", "Refused")]
    ids = [d["delivery_id"] for d in decisions(careful)]
    assert f"{N.raw}:0:2" in ids and f"{N.raw}:1:4" in ids and f"{N.raw}:0:8" in ids
    assert [d["delivery_id"] for d in decisions(fast)] == [i for i in ids if not i.endswith((":0:8", ":0:9"))]


def test_a_set_aside_record_is_numbered_after_the_stored_state_and_named_by_its_key() -> None:
    odd = Incoming(b"pg:dep:\xff", POISON, [("x", b"\xff")], 3, 2, N.raw)
    plan = plan_batch(N, GATEWAYS, [odd], lambda partition, key: orjson.dumps({"n": 6}))
    ((gateway, _),) = plan.set_aside
    assert gateway == "pg"
    (quarantined,) = [r for r in plan.records[2] if r[0] == N.quarantine]
    assert quarantined[1] == f"{N.raw}:2:3".encode()
    (decision,) = decisions(plan)
    assert decision["seq"] == 7 and decision["resource_id"] == "dep:\ufffd"
    unnumbered = plan_batch(N, GATEWAYS, [odd], lambda partition, key: b"{}")
    assert decisions(unnumbered)[0]["seq"] == 1


def test_a_set_aside_record_is_counted_under_its_header_gateway() -> None:
    named = Incoming(b"pg:dep_a", POISON, raw_headers("pg", "d9", 1), 0, 0, N.raw)
    plan = plan_batch(N, GATEWAYS, [named], lambda partition, key: None)
    assert plan.outcomes == Counter({("pg", "quarantined"): 1})


def test_the_size_limit_takes_a_record_or_state_of_exactly_its_size() -> None:
    _check_size([("topic", b"k", b"x" * 10)], b"y" * 10, 10)
    with pytest.raises(Oversize) as record:
        _check_size([("topic", b"k", b"x" * 11)], None, 10)
    assert str(record.value) == "an output record for topic would be 11 bytes (at most 10)"
    with pytest.raises(Oversize) as state:
        _check_size([], b"y" * 11, 10)
    assert str(state.value) == \
        "the resource's state would be 11 bytes (at most 10): too many or too large parked or stored events"


def test_a_set_aside_record_is_counted_under_its_header_gateway_even_when_the_key_names_another() -> None:
    # the header is what the ingest named; the key's prefix is only the fallback (none is sent so)
    named = Incoming(b"pg:dep_a", POISON, raw_headers("card", "d9", 1234, "fetch"), 5, 0, N.raw)
    plan = plan_batch(N, GATEWAYS, [named], lambda partition, key: None)
    assert plan.outcomes == Counter({("card", "quarantined"): 1})
    ((gateway, reason),) = plan.set_aside
    assert gateway == "card" and reason.startswith("Refused: ")
    (decision,) = decisions(plan)
    assert (decision["delivery_id"], decision["received_at_ms"], decision["seq"]) == ("d9", 1234, 1)
    assert (decision["gateway"], decision["resource_id"]) == ("pg", "dep_a")  # the timeline's: by the key
    assert decision["error"] == f"set aside by the worker: {reason}"
    (quarantined,) = [r for r in plan.records[0] if r[0] == N.quarantine]
    assert quarantined[1] == b"d9" and quarantined[2] == POISON
