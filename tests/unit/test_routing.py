"""Routing of verified bodies: resource key from the object, quarantine for what cannot be routed."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.gateways import card, paymos, pg

# The fields each object kind must carry (the rest of the validation is in test_validation.py).
PG_FIELDS = {
    "deposit": {"version": 3, "status": "pending"},
    "balance_transaction": {"type": "deposit", "direction": "credit", "amount_minor": 100,
                            "created_at": "2026-11-29T10:33:15Z"},
}


def pg_body(kind: str, obj_id: str, type_: str = "deposit.settled") -> bytes:
    obj = {"id": obj_id, "object": kind, **PG_FIELDS.get(kind, {})}
    return orjson.dumps({"id": "evt_1", "object": "event", "type": type_, "sequence": 1,
                         "created": "2026-11-29T10:33:15Z", "data": {"object": obj}})


def test_pg_routes_by_object_kind_never_by_id_prefix() -> None:
    assert pg.route(pg_body("deposit", "dep_1")).resource_key == "pg:dep_1"
    # an id that looks like another kind changes nothing: the object kind decides
    assert pg.route(pg_body("balance_transaction", "dep_77", "balance.cleared")).resource_key == "pg:dep_77"
    quarantined = pg.route(pg_body("refund", "dep_1", "deposit.settled"))
    assert quarantined.resource_key is None and quarantined.quarantine_code == "unknown_object"


def test_pg_future_event_types_still_route() -> None:
    # deposit.updated is not in today's catalogue; the guard on data.object handles it.
    assert pg.route(pg_body("deposit", "dep_1", "deposit.updated")).resource_key == "pg:dep_1"


def test_card_allow_list() -> None:
    body = {"id": "evt_1", "type": "payment.captured", "payment_ref": "pay_8c21", "sequence": None,
            "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 8000, "currency": "EUR"}
    assert card.route(orjson.dumps(body)).resource_key == "card:pay_8c21"
    unknown = card.route(orjson.dumps({**body, "type": "payment.disputed"}))
    assert unknown.quarantine_code == "unknown_type" and unknown.event_id == "evt_1"


@pytest.mark.parametrize("event_type", sorted(paymos.EVENT_TYPES))
def test_every_paymos_event_type_routes_on_data_id(event_type: str) -> None:
    body = {"event_id": "evt_9", "event_type": event_type, "created_at": 1_796_000_000_000,
            "data": {"id": "res_1", "object": paymos.OBJECT_OF[event_type], "status": "x", "is_final": False,
                     "updated_at": 1_796_000_000_000}}
    assert paymos.route(orjson.dumps(body)).resource_key == "paymos:res_1"


def test_paymos_has_eighteen_event_types() -> None:
    assert len(paymos.EVENT_TYPES) == 18
    assert (len(paymos.INVOICE_EVENTS), len(paymos.WITHDRAWAL_EVENTS), len(paymos.CHANNEL_EVENTS)) == (9, 6, 3)


@pytest.mark.parametrize("raw", [b"not json", b"[1,2]", b'"str"', b"{}", b'{"id": 5, "type": "x"}'])
def test_unroutable_bodies_are_quarantined(raw: bytes) -> None:
    for adapter in (pg, card, paymos):
        route = adapter.route(raw)
        assert route.resource_key is None and route.quarantine_reason


@given(st.binary(max_size=400) | st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["id", "type", "data", "object", "payment_ref", "event_id", "event_type"]), inner, max_size=4),
    max_leaves=12).map(orjson.dumps))
def test_routing_never_raises(raw: bytes) -> None:
    for adapter in (pg, card, paymos):
        route = adapter.route(raw)
        assert (route.resource_key is None) != (route.quarantine_reason is None)


def test_partitioning_matches_kafkas_default_partitioner() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    from topics.partitioning import partition_for

    for i in range(2000):
        key = f"pg:dep_{i}".encode()
        assert partition_for(key, 12) == DefaultPartitioner()(key, list(range(12)), list(range(12)))
