"""The contract every gateway keeps, run against each registered gateway and the toy fourth one:
signatures (tamper, clock skew, rotation), routing (a valid body to its resource, non-JSON and
hostile bodies to quarantine, never an exception) and its decisions through the worker's own
dispatch. A new gateway passes this by being registered (docs/adding-a-gateway.md)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.dispatch import Incoming, plan_batch
from app.gateways import registry
from app.gateways.base import SignatureError
from app.settings import DEV_DEFAULTS, Settings, SettingsError
from tests import toy_gateway
from tests.paymos_events import event as paymos_event
from tests.pg_events import deposit
from topics.catalog import names
from topics.records import raw_headers

NOW = 1_796_000_000.0
SECRETS = {"pg": "pg-contract-secret", "card": "whsec_Y29udHJhY3QtY2FyZC1rZXktMDEyMzQ1Njc4OQ==",
           "paymos": "paymos-contract-secret", "toy": "toy-contract-secret", "stripe": "whsec_stripe-contract",
           "adyen": "00ff" * 16}
OTHER = {"pg": "pg-other", "card": "whsec_b3RoZXItY2FyZC1rZXktMDEyMzQ1Njc4OQ==", "paymos": "paymos-other",
         "toy": "toy-other", "stripe": "whsec_stripe-other", "adyen": "a1" * 32}


def card_body(ref: str) -> bytes:
    return orjson.dumps({"id": f"evt_{ref}", "type": "payment.authorised", "payment_ref": ref, "sequence": None,
                         "occurred_at": "2026-11-29T10:02:15.123Z", "amount_minor": 8000, "currency": "EUR"})


def stripe_event(pi: str) -> bytes:
    return orjson.dumps({"id": f"evt_{pi}", "object": "event", "type": "payment_intent.succeeded",
                         "created": 1_796_000_000, "data": {"object": {
                             "id": pi, "object": "payment_intent", "status": "succeeded", "amount": 2000,
                             "amount_received": 2000, "currency": "eur"}}})


EXAMPLES = {  # a valid body about resource "r_1" of each gateway
    "pg": lambda: deposit("r_1", 1, "pending"),
    "card": lambda: card_body("r_1"),
    "paymos": lambda: paymos_event("invoice.confirming", "r_1", "confirming", 1_764_412_395_000),
    "toy": lambda: toy_gateway.example("r_1"),
    "stripe": lambda: stripe_event("r_1"),
    # adyen: one notification item, as each is stored (its request's signatures are checked in
    # tests/unit/test_adyen_gateway.py: they are inside the body, not in a header)
    "adyen": lambda: adyen_item("r_1"),
}


def adyen_item(ref: str) -> bytes:
    return orjson.dumps({"pspReference": ref, "eventCode": "AUTHORISATION", "success": "true",
                         "eventDate": "2026-11-29T10:02:15+01:00", "amount": {"value": 8000, "currency": "EUR"},
                         "merchantAccountCode": "Shop", "merchantReference": "order-1",
                         "additionalData": {"hmacSignature": "AAAA"}})


@pytest.fixture(autouse=True)
def toy_registered() -> Iterator[None]:
    registry.register(toy_gateway.TOY)  # the one line a new gateway needs
    yield
    registry.unregister(toy_gateway.NAME)


GATEWAYS = ["pg", "card", "paymos", "stripe", "toy", "adyen"]
HEADER_SIGNED = [name for name in GATEWAYS if name != "adyen"]  # adyen signs each item inside the body


def gateway(name: str) -> registry.Gateway:
    found = registry.find(name)
    assert found is not None, f"{name} is not registered"
    return found


def test_every_real_gateway_is_covered_here() -> None:
    assert set(registry.GATEWAYS) == set(GATEWAYS)  # a gateway added to the registry needs an example above


@pytest.mark.parametrize("name", HEADER_SIGNED)
def test_its_own_signature_verifies_and_a_valid_body_routes_to_its_resource(name: str) -> None:
    g, body = gateway(name), EXAMPLES[name]()
    g.adapter.verify(body, g.adapter.signed_headers(body, SECRETS[name], NOW), (SECRETS[name],), NOW)
    route = g.adapter.route(body)
    assert (route.resource_key, route.quarantine_reason) == (f"{name}:r_1", None)


@pytest.mark.parametrize("name", HEADER_SIGNED)
def test_a_tampered_body_or_signature_is_refused(name: str) -> None:
    g, body = gateway(name), EXAMPLES[name]()
    headers = g.adapter.signed_headers(body, SECRETS[name], NOW)
    with pytest.raises(SignatureError):
        g.adapter.verify(body.replace(b"r_1", b"r_2"), headers, (SECRETS[name],), NOW)
    for header, value in headers.items():
        forged = {**headers, header: value[:-2] + ("AA" if not value.endswith("AA") else "BB")}
        if forged == headers:
            continue
        with pytest.raises(SignatureError):
            g.adapter.verify(body, forged, (SECRETS[name],), NOW)
    with pytest.raises(SignatureError):
        g.adapter.verify(body, {}, (SECRETS[name],), NOW)


def test_only_paymos_signs_without_a_timestamp() -> None:
    """Its document: replayed deliveries are harmless because of dedupe and the ordering guard."""
    assert [name for name in GATEWAYS if not gateway(name).timestamped] == ["paymos", "adyen"]  # adyen: no time


@pytest.mark.parametrize("name", [name for name in HEADER_SIGNED if name != "paymos"])
def test_clock_skew_beyond_300_s_is_refused_both_ways(name: str) -> None:
    g, body = gateway(name), EXAMPLES[name]()
    for skew in (-301, 301):
        with pytest.raises(SignatureError):
            g.adapter.verify(body, g.adapter.signed_headers(body, SECRETS[name], NOW + skew), (SECRETS[name],), NOW)
    for skew in (-299, 299):
        g.adapter.verify(body, g.adapter.signed_headers(body, SECRETS[name], NOW + skew), (SECRETS[name],), NOW)


@pytest.mark.parametrize("name", HEADER_SIGNED)
def test_secret_rotation_accepts_either_secret(name: str) -> None:
    g, body = gateway(name), EXAMPLES[name]()
    old = g.adapter.signed_headers(body, OTHER[name], NOW)
    g.adapter.verify(body, old, (SECRETS[name], OTHER[name]), NOW)
    with pytest.raises(SignatureError):
        g.adapter.verify(body, old, (SECRETS[name],), NOW)


@pytest.mark.parametrize("name", ["pg", "card", "paymos", "stripe", "adyen"])
def test_an_empty_secret_is_refused_at_start(name: str) -> None:
    with pytest.raises(SettingsError, match=f"ORDERLY_SECRET_{name.upper()}"):
        Settings.from_env({**DEV_DEFAULTS, f"ORDERLY_SECRET_{name.upper()}": ""})
    with pytest.raises(SettingsError, match=f"ORDERLY_SECRET_{name.upper()}"):
        Settings.from_env({**DEV_DEFAULTS, f"ORDERLY_SECRET_{name.upper()}": f"{SECRETS[name]}, "})


@pytest.mark.parametrize("name", GATEWAYS)
def test_a_body_that_is_not_json_is_quarantined(name: str) -> None:
    for body in (b"not json", b"", b"[1, 2]", b"\xff\xfe", b'{"unterminated": '):
        route = gateway(name).adapter.route(body)
        assert route.resource_key is None and route.quarantine_code in ("not_json", "invalid"), (body, route)
        assert route.quarantine_reason


def json_bytes(value: object) -> bytes:
    return json.dumps(value).encode()  # the standard library writes integers of any size, as a sender may


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(GATEWAYS), st.one_of(st.binary(max_size=200), json_values.map(json_bytes)))
def test_routing_never_raises_on_any_body(name: str, body: bytes) -> None:
    route = gateway(name).adapter.route(body)
    assert (route.resource_key is None) == (route.quarantine_reason is not None)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(GATEWAYS), st.data())
def test_hostile_mutations_of_a_valid_body_are_quarantined_or_routed_never_raised(name: str, data: st.DataObject
                                                                               ) -> None:
    """Every field of a valid body replaced by a value of another type, a huge integer, a long or
    NUL-holding string, or removed."""
    body: dict[str, Any] = orjson.loads(EXAMPLES[name]())
    paths = list(_paths(body))
    path = data.draw(st.sampled_from(paths))
    value: object = data.draw(st.sampled_from(
        ["x" * 6000, "a\x00b", 2**64, -(2**63) - 1, 1.5, [], {}, None, True, "REMOVE"]))
    parent: Any = body
    for step in path[:-1]:
        parent = parent[step]
    if value == "REMOVE":
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    route = gateway(name).adapter.route(json_bytes(body))
    assert (route.resource_key is None) == (route.quarantine_reason is not None)


def _paths(value: object, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(value, dict):
        for key, child in value.items():
            yield (*prefix, key)
            yield from _paths(child, (*prefix, key))


def test_the_toy_gateway_is_decided_by_the_workers_own_dispatch() -> None:
    n = names("t")
    batch = [Incoming(b"toy:thg_1", toy_gateway.example("thg_1", v, f"e{v}"),
                      raw_headers("toy", f"d{i}", 1_700_000_000_000), i, 0, n.raw)
             for i, v in enumerate([2, 1, 3, 3])]
    plan = plan_batch(n, registry.GATEWAYS, batch, lambda partition, key: None)
    outcomes = [orjson.loads(r[2])["outcome"] for r in plan.records[0] if r[0] == n.decisions]
    assert outcomes == ["applied", "stale", "applied", "duplicate"] and not plan.set_aside
    assert orjson.loads(plan.states[b"toy:thg_1"])["version"] == 3
    snapshot = [orjson.loads(r[2]) for r in plan.records[0] if r[0] == n.state]
    assert snapshot == [{"version": 3, "thing": {"id": "thg_1", "version": 3, "status": "open"}}]


def test_random_interleavings_of_toy_snapshots_end_at_the_newest() -> None:
    n, rng = names("t"), random.Random(7)
    versions = list(range(1, 9))
    rng.shuffle(versions)
    batch = [Incoming(b"toy:thg_2", toy_gateway.example("thg_2", v), raw_headers("toy", f"d{i}", 1), i, 0, n.raw)
             for i, v in enumerate(versions)]
    plan = plan_batch(n, registry.GATEWAYS, batch, lambda partition, key: None)
    assert orjson.loads(plan.states[b"toy:thg_2"])["version"] == 8
