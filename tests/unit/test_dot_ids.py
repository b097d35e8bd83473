"""Ids "." and ".." are refused by every gateway's schema (issue #45, item 5): the fetcher builds its
gateway API URLs from them, and such a segment collapses (a card payment_ref ".." made it GET the
API's root). The body is quarantined with a reason naming the field, never routed, never raised."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.gateways import registry
from app.gateways.limits import id_error
from tests.unit.test_gateway_contract import EXAMPLES

# The resource id of each example is "r_1"; adyen's may also come from originalReference.
CASES = [(name, dots) for name in sorted(registry.GATEWAYS) for dots in (".", "..")]


@pytest.mark.parametrize(("name", "dots"), CASES)
def test_a_resource_id_of_dots_is_quarantined_with_the_field_named(name: str, dots: str) -> None:
    found = registry.find(name)
    assert found is not None
    assert found.adapter.route(EXAMPLES[name]()).resource_key == f"{name}:r_1"  # the example itself routes
    route = found.adapter.route(EXAMPLES[name]().replace(b'"r_1"', orjson.dumps(dots)))
    assert route.resource_key is None, route  # the old schemas routed it to f"{name}:{dots}"
    assert route.quarantine_reason and route.quarantine_code == "invalid", route


@pytest.mark.parametrize("dots", [".", ".."])
def test_an_adyen_original_reference_of_dots_is_quarantined(dots: str) -> None:
    found = registry.find("adyen")
    assert found is not None
    body = {**orjson.loads(EXAMPLES["adyen"]()), "originalReference": dots}
    route = found.adapter.route(orjson.dumps(body))
    assert route.resource_key is None and "originalReference" in (route.quarantine_reason or ""), route


@given(st.text(min_size=1, max_size=8))
def test_only_the_two_dot_ids_are_newly_refused(value: str) -> None:
    refused = id_error("payment_ref", value)
    if value in (".", ".."):
        assert refused is not None and refused.startswith("payment_ref: ")
    elif value.isprintable():
        assert refused is None  # "...", "a..", "./x" stay ids (the fetcher percent-encodes them)
