"""The input limits of DESIGN.md §2.4 at their edges, and the refusals that name the field (killing
mutmut's survivors in app/gateways/limits.py, schema.py and pg.py's read, docs/testing.md).

The bounds are §2.4's: JSON nesting at most 32 deep, integers within signed 64 bits, no NUL, ids of
1-200 printable characters (and never "." or "..", limits.NOT_DOTS), timestamps between 2000-01-01
and 2100-01-01 (a time without a zone reads as UTC, limits._ISO_TIME). A refusal's reason starts
with the field path (``data.object.review: expected object, got str``, schema.py), ``body`` when
the whole body is at fault.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import msgspec
import orjson
import pytest

from app.gateways import card, limits, pg, schema
from app.gateways.base import Route
from app.gateways.limits import DEPTH_MAX, INT64_MAX
from app.gateways.schema import Refusal
from tests.pg_events import deposit


def nested_lists(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def nested_objects(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = {"a": value}
    return value


# --- limits.value_error: the walk of a decoded body ---

@pytest.mark.parametrize("nest", [nested_lists, nested_objects])
def test_nesting_of_32_passes_and_33_is_refused(nest: object) -> None:
    assert callable(nest)
    assert limits.value_error(nest(DEPTH_MAX)) is None
    deeper = limits.value_error(nest(DEPTH_MAX + 1))
    assert deeper is not None and deeper.endswith(": JSON nests deeper than 32")


def test_a_nul_or_a_big_integer_at_the_top_is_the_body_s_fault() -> None:
    assert limits.value_error({"a\x00": 1}) == "body: a key holds a NUL character"
    assert limits.value_error({"a\x00b": 1}) == "body: a key holds a NUL character"
    assert limits.value_error(INT64_MAX + 1) == "body: integer outside the signed 64-bit range"
    assert limits.value_error("x\x00") == "body: a string holds a NUL character"


def test_a_nul_or_a_big_integer_below_the_top_names_its_path() -> None:
    assert limits.value_error({"a": {"b\x00": 1}}) == "a: a key holds a NUL character"
    assert limits.value_error({"a": [1, INT64_MAX + 1]}) == "a[1]: integer outside the signed 64-bit range"
    assert limits.value_error({"a": {"b": "x\x00"}}) == "a.b: a string holds a NUL character"
    assert limits.value_error({"a": {"b": "x", "c": [INT64_MAX, -INT64_MAX - 1]}}) is None


# --- the scans in C that clear the usual body before any walk ---

def test_the_nesting_scan_counts_objects_and_arrays_up_to_the_limit() -> None:
    assert not limits.may_nest_deeper(b"[" * DEPTH_MAX)
    assert not limits.may_nest_deeper(b"{" * DEPTH_MAX)
    assert limits.may_nest_deeper(b"[" * (DEPTH_MAX + 1))
    assert limits.may_nest_deeper(b"{" * (DEPTH_MAX + 1))
    assert limits.may_nest_deeper(b"{" * 17 + b"[" * 16)


def test_the_nul_scan_clears_a_body_with_other_escapes() -> None:
    assert not limits.may_hold_nul(b'{"a": "line\\nbreak \\"quoted\\""}')
    assert not limits.may_hold_nul(b'{"a": "u0000 without its backslash"}')
    assert limits.may_hold_nul(b'{"a": "\\u0000"}')


# --- limits.id_error ---

def test_an_id_is_a_string_never_a_dot_or_two() -> None:
    assert limits.id_error("id", 5) == "id: expected a string id, got int"
    assert limits.id_error("id", None) == "id: expected a string id, got NoneType"
    for dots in (".", ".."):
        problem = limits.id_error("id", dots)
        assert problem is not None and problem.startswith("id: ")
    assert limits.id_error("id", "...") is None
    assert limits.id_error("id", ".a") is None


# --- limits.time_error ---

@pytest.fixture
def east_of_utc() -> Iterator[None]:
    """The process's local zone ten hours east of UTC: a time without a zone must not read as local."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TZ", "EAST-10")
        time.tzset()
        try:
            yield
        finally:
            patch.undo()
            time.tzset()


def test_times_at_the_bounds_and_zones_read_right() -> None:
    assert limits.time_error("t", "2000-01-01T00:00:00Z") is None
    assert limits.time_error("t", "2100-01-01T00:00:00Z") is None
    assert limits.time_error("t", "2100-01-01T00:00:00.001Z") is not None
    assert limits.time_error("t", "1999-12-31T23:59:59Z") is not None
    # 00:30 an hour east of UTC is 23:30 the day before in UTC: inside the range
    assert limits.time_error("t", "2100-01-01T00:30:00+01:00") is None
    # 23:30 an hour west of UTC is 00:30 the next day: outside
    assert limits.time_error("t", "2099-12-31T23:30:00-01:00") == "t: time outside 2000-01-01..2100-01-01"


def test_a_time_without_a_zone_reads_as_utc(east_of_utc: None) -> None:
    assert limits.time_error("t", "2000-01-01T05:00:00") is None
    assert limits.time_error("t", "2099-12-31T20:00:00") is None
    assert limits.time_error("t", "1999-12-31T23:00:00") is not None


def test_a_time_of_another_shape_is_shown_up_to_its_40_characters() -> None:
    value = "x" * 60
    assert limits.time_error("t", value) == (
        f"t: expected an ISO 8601 time YYYY-MM-DDTHH:MM:SS[.f][Z|±HH:MM], got {'x' * 40!r}")


# --- schema: the refusals name the field, the two reads of a body refuse alike ---

class Inner(schema.Body):
    fooX: int  # a name ending in X: a path is cut of its closing backtick only


def test_a_refusal_names_the_field_path() -> None:
    assert schema.typed(msgspec.json.Decoder(Inner), b'{"fooX": "a"}') == Refusal(
        "invalid", "fooX: expected int, got str")
    assert schema.convert([{"fooX": 1}, {"fooX": "a"}], list[Inner], "items") == Refusal(
        "invalid", "items[1].fooX: expected int, got str")
    assert schema.convert({"fooX": "a"}, Inner, "data.object") == Refusal(
        "invalid", "data.object.fooX: expected int, got str")
    assert schema.convert("a", Inner, "") == Refusal("invalid", "body: expected object, got str")


@pytest.mark.parametrize("raw", [b"not json", b"{", b"", b"[1]", b'"text"', b"5", b"null", b"[]"])
def test_the_ingest_s_and_the_worker_s_read_refuse_a_body_alike(raw: bytes) -> None:
    decoded = schema.decode(msgspec.json.Decoder(Inner), raw)
    parsed = schema.typed(msgspec.json.Decoder(Inner), raw)
    assert isinstance(decoded, Refusal) and decoded == parsed
    assert decoded.code == "not_json"
    assert decoded.reason in ("body is not JSON", "body is not a JSON object")
    assert (decoded.reason == "body is not JSON") == (raw in (b"not json", b"{", b""))


# --- pg: the worker's read of a record no adapter took makes the ingest's checks (read's docstring) ---

def test_pg_read_unchecked_refuses_as_route_does() -> None:
    raw = deposit("dep_1", 1, "pending", amount=INT64_MAX + 1)
    expected = Route.quarantine("invalid", "data.object.ordered_amount_minor: integer outside the signed 64-bit range",
                                "evt_dep_1_v1", "deposit.pending", "pg:dep_1")
    assert pg.route(raw) == expected
    assert pg.read(raw, checked=False) == expected


@pytest.mark.parametrize("field", ["late_slip_accepted_until", "clearing_available_at"])
@pytest.mark.parametrize("value", ["1999-12-31T23:59:59Z", "yesterday"])
def test_pg_deposit_times_are_checked_each_alone(field: str, value: str) -> None:
    extra: dict[str, Any] = {field: value}
    raw = deposit("dep_1", 1, "pending", **extra)
    route = pg.route(raw)
    assert route.resource_key is None and route.quarantine_code == "invalid"
    assert (route.quarantine_reason or "").startswith(f"data.object.{field}: "), route
    good: dict[str, Any] = {field: "2026-11-30T10:04:41Z"}
    assert pg.route(deposit("dep_1", 1, "pending", **good)).resource_key == "pg:dep_1"


def test_a_value_that_holds_msgspec_s_path_marker_does_not_move_the_path() -> None:
    # the field's own check quotes the value; the path msgspec appends after it is the last " - at `"
    extra: dict[str, Any] = {"late_slip_accepted_until": "x - at `y"}
    route = pg.route(deposit("dep_1", 1, "pending", **extra))
    assert route.quarantine_code == "invalid"
    assert (route.quarantine_reason or "").startswith("data.object.late_slip_accepted_until: "), route


def test_nesting_under_empty_keys_is_the_body_s_fault() -> None:
    # an empty key adds no name to the path: the reason has no field to name but the body
    value: object = 0
    for _ in range(DEPTH_MAX + 1):
        value = {"": value}
    assert limits.value_error(value) == "body: JSON nests deeper than 32"


@pytest.mark.parametrize("value", ["x - at `y`", "x - at `$.y`", "x - at `$`"])
def test_a_top_level_value_that_holds_msgspec_s_path_marker_cannot_name_another_field(value: str) -> None:
    # a top-level field's own check has no path from msgspec after it: the marker inside the quoted
    # value once became the reason's path ("y`'.occurred_at: ...")
    body = orjson.dumps({"id": "ev1", "type": "payment.authorised", "payment_ref": "pay_n", "sequence": 1,
                         "occurred_at": value, "amount_minor": 10, "currency": "EUR"})
    route = card.route(body)
    assert route.quarantine_code == "invalid"
    assert (route.quarantine_reason or "").startswith("occurred_at: expected an ISO 8601 time"), route
