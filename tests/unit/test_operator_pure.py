"""The operator's pure helpers (issue #48 item 5): bulk filters, the timeline's two orders, amounts
with their currency and times with their zone (app/admin/bulk.py, timeline.py, display.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from app.admin import auth, bulk, display, timeline

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


# --- bulk filters -----------------------------------------------------------------------------

def test_a_filter_takes_its_defaults_and_names_itself_for_the_audit() -> None:
    found = bulk.parse_filter("effects", {"gateway": "pg", "since": "2h", "type": "credit_user"}, NOW)
    assert (found.state, found.gateway, found.type, found.since, found.until, found.limit) == (
        "dead", "pg", "credit_user", NOW - timedelta(hours=2), None, bulk.MOST_PER_CALL)
    assert found.describe() == "state=dead gateway=pg type=credit_user since=2026-11-29T10:00:00Z limit=1000"
    quarantined = bulk.parse_filter("quarantine", {"stage": "worker", "reason": "JSON", "limit": "5"}, NOW)
    assert (quarantined.state, quarantined.type, quarantined.reason, quarantined.limit) == (
        "waiting", "worker", "JSON", 5)


@pytest.mark.parametrize(("kind", "given", "named"), [
    ("effects", {"state": "delivered"}, "state must be one of dead, pending"),
    ("quarantine", {"state": "dead"}, "state must be one of waiting, redriven, any"),
    ("effects", {"gateway": "nope"}, "unknown gateway 'nope'"),
    ("quarantine", {"stage": "nowhere"}, "stage must be one of"),
    ("effects", {"since": "2026-11-29T10:00:00"}, "since must name its zone"),
    ("effects", {"until": "yesterday"}, "until must be ISO 8601 with a zone"),
    ("effects", {"since": "1h", "until": "2h"}, "since must be before until"),
    ("effects", {"until": "9999-12-31T23:00:00-05:00"}, "until: 9999-12-31T23:00:00-05:00 is out of range"),
    ("effects", {"limit": "1001"}, "limit must be an integer from 1 to 1000"),
    ("effects", {"limit": "0"}, "limit must be an integer from 1 to 1000"),
    ("effects", {"limit": "\u00b2"}, "limit must be an integer"),
    ("effects", {"type": "x\x00"}, "type must be at most 200 characters without NUL"),
])
def test_a_bad_filter_is_refused_naming_the_parameter(kind: bulk.Kind, given: dict[str, str], named: str) -> None:
    with pytest.raises(bulk.BadFilter, match=named.replace("(", r"\(")):
        bulk.parse_filter(kind, given, NOW)


@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 1, 1),
                    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)),
                                               timezone(timedelta(hours=-8))])))
def test_an_instant_with_its_zone_is_read_as_that_instant(when: datetime) -> None:
    assert bulk.parse_instant("since", when.isoformat(), NOW) == when


@given(st.integers(1, 9_999_999), st.sampled_from(["s", "m", "h", "d"]))
def test_an_age_is_that_long_before_now_or_refused(n: int, unit: str) -> None:
    seconds = n * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    if seconds > (NOW - datetime(1, 1, 1, tzinfo=UTC)).total_seconds():
        with pytest.raises(bulk.BadFilter, match="further back than any record"):
            bulk.parse_instant("since", f"{n}{unit}", NOW)
    else:
        assert NOW - bulk.parse_instant("since", f"{n}{unit}", NOW) == timedelta(seconds=seconds)


def test_dry_run_is_a_boolean_or_refused() -> None:
    assert [bulk.dry_run_flag(v) for v in (None, "", "false", "0", "true", "1")] == [False] * 4 + [True] * 2
    with pytest.raises(bulk.BadFilter, match="dry_run must be true or false"):
        bulk.dry_run_flag("yes")


# --- the timeline's two orders ------------------------------------------------------------------

def card(event: str, second: int) -> dict[str, object]:
    return {"event_id": event, "version": None, "sequence": None,
            "gateway_time": f"2026-11-29T10:02:{15 + second:02d}.123Z"}


def test_a_card_payment_in_both_orders_marks_the_authorisation_that_came_last() -> None:
    arrived: list[dict[str, object]] = [card("evt_c1", 1), card("evt_r", 2), card("evt_a", 0),
               {"event_id": None, "version": None, "sequence": None, "gateway_time": None}]
    by_arrival = timeline.ordered(arrived, "arrival")
    assert [(d["event_id"], d["arrival"], d["gateway_position"], d["late"]) for d in by_arrival] == [
        ("evt_c1", 1, 2, False), ("evt_r", 2, 3, False), ("evt_a", 3, 1, True), (None, 4, None, False)]
    by_gateway = timeline.ordered(arrived, "gateway")
    assert [d["event_id"] for d in by_gateway] == ["evt_a", "evt_c1", "evt_r", None]


def test_pg_orders_by_version_and_a_duplicate_is_not_late() -> None:
    arrived = [{"version": "3", "sequence": "12", "gateway_time": "2026-11-29T10:00:03Z"},
               {"version": "1", "sequence": "10", "gateway_time": "2026-11-29T10:00:01Z"},
               {"version": "3", "sequence": "12", "gateway_time": "2026-11-29T10:00:03Z"}]
    listed = timeline.ordered(arrived, "arrival")
    assert [d["late"] for d in listed] == [False, True, False]
    assert [d["arrival"] for d in timeline.ordered(arrived, "gateway")] == [2, 1, 3]


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), max_size=12))
def test_gateway_order_is_sorted_and_late_is_arrival_after_a_later_one(keys: list[tuple[int, int]]) -> None:
    arrived = [{"version": str(v), "sequence": str(s), "gateway_time": None} for v, s in keys]
    in_gateway_order = [(int(d["version"]), int(d["sequence"])) for d in timeline.ordered(arrived, "gateway")]
    assert in_gateway_order == sorted(keys)
    for i, d in enumerate(timeline.ordered(arrived, "arrival")):
        assert d["late"] == any(earlier > keys[i] for earlier in keys[:i])
        assert d["gateway_position"] is not None


def test_gateway_times_compare_across_zones_and_units() -> None:
    assert timeline.instant("2026-11-29T11:00:00+01:00") == timeline.instant("2026-11-29T10:00:00Z")
    assert timeline.instant("1795946400") == 1795946400
    assert [timeline.instant(v) for v in ("2026-11-29T10:00:00", "soon", None, True, "9" * 30)] == [None] * 5
    assert [timeline.order_of(v) for v in (None, "", "arrival", "gateway", "random")] == [
        "arrival", "arrival", "arrival", "gateway", None]


@given(st.text(alphabet="-0123456789+ .eE", max_size=24) | st.text(max_size=24))
@example("--5")
@example("-")
def test_a_hostile_ordering_field_is_no_position_or_its_integer_never_an_error(text: str) -> None:
    # "--5" passed the old digits check and then int() raised: the resource's page answered 500
    key = timeline.gateway_key({"version": text, "sequence": text, "gateway_time": text})
    plain = text.isascii() and len(text) <= 20 and text.removeprefix("-").isdigit()
    assert key == ((int(text), int(text), int(text)) if plain else None)


# --- amounts and times --------------------------------------------------------------------------

@pytest.mark.parametrize(("minor", "currency", "shown"), [
    (8000, "EUR", "80.00 EUR"), (5, "usd", "0.05 USD"), (500, "JPY", "500 JPY"), (-1234, "KWD", "-1.234 KWD"),
    (12345, "CLF", "1.2345 CLF"), (0, "GBP", "0.00 GBP"), (7, "USDT-TRC20", "7 minor units of USDT-TRC20"),
])
def test_an_amount_is_shown_in_its_currency(minor: int, currency: str, shown: str) -> None:
    assert display.money(minor, currency) == shown


@given(st.integers(-10**15, 10**15), st.sampled_from(["EUR", "JPY", "BHD", "CLF", "chf"]))
def test_the_shown_amount_is_exactly_the_minor_units(minor: int, currency: str) -> None:
    number, code = display.money(minor, currency).split(" ")
    places = display.exponent(currency)
    assert places is not None and code == currency.upper()
    assert Decimal(number) * 10 ** places == minor  # exact, never through a float
    assert ("." in number) == (places > 0)


def test_a_state_row_and_a_body_get_their_amounts_with_their_currency() -> None:
    assert display.amounts({"captured_minor": 8000, "refunded_minor": 0, "currency": "EUR", "state": "x",
                            "is_final": True}) == {"captured_minor": "80.00 EUR", "refunded_minor": "0.00 EUR"}
    assert display.amounts({"ordered_amount_minor": 100}) == {}  # no currency named: nothing guessed
    assert display.delivery_amount({"amount_minor": 12000, "currency": "EUR"}) == "120.00 EUR"
    assert display.delivery_amount({"data": {"object": {"amount": 999, "currency": "jpy"}}}) == "999 JPY"
    assert display.delivery_amount({"amount": {"value": 1050, "currency": "EUR"}}) == "10.50 EUR"
    unusable: list[object] = [None, [], {"amount": 1.5, "currency": "EUR"}]
    assert [display.delivery_amount(v) for v in unusable] == ["", "", ""]


def test_times_carry_their_zone() -> None:
    cet = timezone(timedelta(hours=1))
    assert display.zoned(datetime(2026, 11, 29, 11, 2, 16, 500, tzinfo=cet)) == "2026-11-29T10:02:16Z"
    assert display.gateway_time("1795946400") == "2026-11-29T10:00:00Z (1795946400)"
    assert display.gateway_time("1795946400123") == "2026-11-29T10:00:00.123Z (1795946400123)"
    assert display.gateway_time("2026-11-29T10:02:16.123Z") == "2026-11-29T10:02:16.123Z"
    assert display.gateway_time(None) == ""


def test_the_bulk_actions_need_the_operator_role() -> None:
    assert auth.required_role("POST", "/api/effects/retry") == "operator"
    assert auth.required_role("POST", "/api/quarantine/redrive") == "operator"
    assert auth.required_role("GET", "/api/resources/card/pay_1") == "viewer"  # either order is a read
