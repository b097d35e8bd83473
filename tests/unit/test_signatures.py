"""Signature schemes of the three gateways: known-answer vectors, rotation, tolerance, refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.gateways import card, paymos, pg
from app.gateways.base import SignatureError

BODY = b'{"id":"evt_1"}'
NOW = 1_796_000_000

# Computed independently with `openssl dgst -sha256 -hmac` (see the test names for the inputs).
PG_VECTOR = "bf12cde803ebc2c96f3317d5ed6d704ce9d0679ca45ae9532cb76a28890f15eb"
PAYMOS_VECTOR = "32abd18a2ec69d297d642f8f4549632cae2ca5fc54d5c426f12260fd702c553a"
# The Standard Webhooks specification's own example.
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SW_ID, SW_TS, SW_BODY = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
SW_VECTOR = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_pg_known_answer() -> None:
    assert pg.sign(BODY, "pg_secret_A", NOW) == f"t={NOW},v1={PG_VECTOR}"
    pg.verify(BODY, {"PG-Signature": f"t={NOW},v1={PG_VECTOR}"}, ("pg_secret_A",), NOW)


def test_paymos_known_answer() -> None:
    assert paymos.sign(BODY, "paymos_secret") == f"sha256={PAYMOS_VECTOR}"
    paymos.verify(BODY, {"X-Paymos-Signature": f"sha256={PAYMOS_VECTOR}"}, ("paymos_secret",), NOW)


def test_standard_webhooks_known_answer() -> None:
    assert card.sign(SW_BODY, SW_SECRET, SW_ID, SW_TS) == SW_VECTOR
    headers = {"webhook-id": SW_ID, "webhook-timestamp": str(SW_TS), "webhook-signature": SW_VECTOR}
    card.verify(SW_BODY, headers, (SW_SECRET,), SW_TS)
    # The key is the base64 after the prefix; the same key without the prefix verifies too.
    card.verify(SW_BODY, headers, (SW_SECRET.removeprefix("whsec_"),), SW_TS)


def test_pg_rotation_and_several_signatures() -> None:
    old = pg.sign(BODY, "old", NOW).split(",")[1]
    new = pg.sign(BODY, "new", NOW).split(",")[1]
    header = f"t={NOW},{old},{new}"
    pg.verify(BODY, {"PG-Signature": header}, ("new",), NOW)
    pg.verify(BODY, {"PG-Signature": header}, ("other", "old"), NOW)
    with pytest.raises(SignatureError):
        pg.verify(BODY, {"PG-Signature": header}, ("other",), NOW)


def test_card_rotation_and_several_signatures() -> None:
    other = "whsec_" + "b3RoZXIta2V5LWZvci10ZXN0cw=="
    sig_a = card.sign(SW_BODY, SW_SECRET, SW_ID, SW_TS)
    sig_b = card.sign(SW_BODY, other, SW_ID, SW_TS)
    headers = {"webhook-id": SW_ID, "webhook-timestamp": str(SW_TS), "webhook-signature": f"v1a,xyz {sig_b} {sig_a}"}
    card.verify(SW_BODY, headers, (SW_SECRET,), SW_TS)
    card.verify(SW_BODY, headers, ("whsec_bm9wZQ==", other), SW_TS)


def test_paymos_rotation() -> None:
    header = {"X-Paymos-Signature": paymos.sign(BODY, "second")}
    paymos.verify(BODY, header, ("first", "second"), NOW)
    with pytest.raises(SignatureError):
        paymos.verify(BODY, header, ("first",), NOW)


@pytest.mark.parametrize("skew", [-301, 301, -10_000, 10_000])
def test_stale_or_future_timestamps_are_refused(skew: int) -> None:
    with pytest.raises(SignatureError, match="tolerance"):
        pg.verify(BODY, {"PG-Signature": pg.sign(BODY, "s", NOW + skew)}, ("s",), NOW)
    sig = card.sign(BODY, SW_SECRET, "msg_1", NOW + skew)
    with pytest.raises(SignatureError, match="tolerance"):
        card.verify(BODY, {"webhook-id": "msg_1", "webhook-timestamp": str(NOW + skew),
                           "webhook-signature": sig}, (SW_SECRET,), NOW)


@pytest.mark.parametrize("skew", [-300, 0, 300])
def test_timestamps_inside_the_tolerance_pass(skew: int) -> None:
    pg.verify(BODY, {"PG-Signature": pg.sign(BODY, "s", NOW + skew)}, ("s",), NOW)


def test_tampering_fails() -> None:
    header = {"PG-Signature": pg.sign(BODY, "s", NOW)}
    with pytest.raises(SignatureError):
        pg.verify(BODY + b" ", header, ("s",), NOW)
    # the timestamp is part of what is signed
    forged = header["PG-Signature"].replace(f"t={NOW}", f"t={NOW + 1}")
    with pytest.raises(SignatureError):
        pg.verify(BODY, {"PG-Signature": forged}, ("s",), NOW)
    sig = card.sign(BODY, SW_SECRET, "msg_1", NOW)
    with pytest.raises(SignatureError):  # the message id is signed too
        card.verify(BODY, {"webhook-id": "msg_2", "webhook-timestamp": str(NOW), "webhook-signature": sig},
                    (SW_SECRET,), NOW)


@pytest.mark.parametrize("header", [
    {}, {"PG-Signature": ""}, {"PG-Signature": "v1=abcd"}, {"PG-Signature": f"t={NOW}"},
    {"PG-Signature": f"t={NOW},v1=zz"}, {"PG-Signature": f"t=now,v1={PG_VECTOR}"},
    {"PG-Signature": f"t={NOW},t={NOW},v1={PG_VECTOR}"},
])
def test_malformed_pg_headers_are_refused(header: dict[str, str]) -> None:
    with pytest.raises(SignatureError):
        pg.verify(BODY, header, ("pg_secret_A",), NOW)


def test_bad_card_secret_is_refused_at_start() -> None:
    with pytest.raises(ValueError):
        card.secret_key("whsec_not*base64")
    with pytest.raises(ValueError):
        card.secret_key("whsec_")


header_values = st.text(st.characters(codec="latin-1"), max_size=120)


@settings(max_examples=300)
@given(raw=st.binary(max_size=300), values=st.lists(header_values, min_size=4, max_size=4), now=st.integers(0, 2**40))
def test_verification_only_ever_refuses_with_a_reason(raw: bytes, values: list[str], now: int) -> None:
    cases = [
        (pg, {"PG-Signature": values[0]}, ("s",)),
        (card, {"webhook-id": values[1], "webhook-timestamp": values[2], "webhook-signature": values[3]},
         (SW_SECRET,)),
        (paymos, {"X-Paymos-Signature": values[0]}, ("s",)),
    ]
    for adapter, headers, secrets in cases:
        with pytest.raises(SignatureError):
            adapter.verify(raw, headers, secrets, now)
