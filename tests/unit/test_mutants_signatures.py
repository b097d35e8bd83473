"""Each signature refusal says why, in its own words: the reason is the 401 answer's body and the log
line an operator reads (killing mutmut's survivors in app/gateways' verify paths, docs/testing.md)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping

import msgspec
import orjson
import pytest

from app.gateways import adyen, card, paymos, pg, stripe
from app.gateways.base import SignatureError, check_timestamp, header

NOW = 1_796_000_000
BODY = b'{"id":"evt_1"}'
CARD_SECRET = "whsec_" + base64.b64encode(b"card-key-for-tests").decode()
ADYEN_KEY = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056"

Verify = Callable[[bytes, Mapping[str, str], tuple[str, ...], float], None]


def reason(verify: Verify, raw: bytes, headers: Mapping[str, str], secrets: tuple[str, ...]) -> str:
    with pytest.raises(SignatureError) as caught:
        verify(raw, headers, secrets, NOW)
    assert str(caught.value) == caught.value.reason
    return caught.value.reason


@pytest.mark.parametrize(("raw_ts", "why"), [
    (None, "missing timestamp"),
    ("", "missing timestamp"),
    ("12a", "timestamp is not 1-12 ASCII digits"),
    ("1234567890123", "timestamp is not 1-12 ASCII digits"),
    (str(NOW - 301), "timestamp outside the 300 s tolerance"),
    (str(NOW + 301), "timestamp outside the 300 s tolerance"),
])
def test_a_timestamp_is_refused_with_its_reason(raw_ts: str | None, why: str) -> None:
    with pytest.raises(SignatureError, match=f"^{why}$"):
        check_timestamp(raw_ts, NOW)


def test_a_timestamp_at_the_tolerance_passes() -> None:
    check_timestamp(str(NOW - 300), NOW)
    check_timestamp(str(NOW + 300), NOW)


def test_a_header_that_is_not_ascii_is_refused_by_name() -> None:
    with pytest.raises(SignatureError, match=r"^PG-Signature header is not ASCII$"):
        header({"PG-Signature": "t=1,v1=\udcff"}, "PG-Signature")
    assert header({"PG-Signature": "t=1"}, "PG-Signature") == "t=1"
    assert header({}, "PG-Signature") is None


def test_pg_refusals() -> None:
    good = pg.sign(BODY, "s", NOW)
    assert reason(pg.verify, BODY, {}, ("s",)) == "missing PG-Signature header"
    assert reason(pg.verify, BODY, {"PG-Signature": f"t={NOW},t={NOW},v1=00"}, ("s",)) == \
        "PG-Signature carries two timestamps"
    assert reason(pg.verify, BODY, {"PG-Signature": "v1=00"}, ("s",)) == "PG-Signature has no t="
    assert reason(pg.verify, BODY, {"PG-Signature": f"t={NOW},v1=zz"}, ("s",)) == "PG-Signature has no v1= signature"
    assert reason(pg.verify, BODY, {"PG-Signature": good}, ("other",)) == "no PG-Signature v1 matches"
    # a malformed entry and one without "=" are skipped, not fatal: the good one after them counts
    pg.verify(BODY, {"PG-Signature": f"junk,v1=zz, {good}"}, ("s",), NOW)


def test_card_refusals_and_secrets() -> None:
    headers = card.signed_headers(BODY, CARD_SECRET, NOW)
    assert reason(card.verify, BODY, {**headers, "webhook-id": ""}, (CARD_SECRET,)) == \
        "missing webhook-id or webhook-signature header"
    assert reason(card.verify, BODY, {k: v for k, v in headers.items() if k != "webhook-signature"},
                  (CARD_SECRET,)) == "missing webhook-id or webhook-signature header"
    assert reason(card.verify, BODY, {**headers, "webhook-signature": "v1a,abc v1,!!! v2,AAAA"},
                  (CARD_SECRET,)) == "webhook-signature has no v1 entry"
    other = "whsec_" + base64.b64encode(b"another-key").decode()
    assert reason(card.verify, BODY, headers, (other,)) == "no webhook-signature v1 matches"
    # bad entries first are skipped: the good one after them counts
    card.verify(BODY, {**headers, "webhook-signature": "v1,!!! v1a,x " + headers["webhook-signature"]},
                (CARD_SECRET,), NOW)
    with pytest.raises(ValueError, match=r"^card secret is not base64 after 'whsec_'$"):
        card.secret_key("whsec_not*base64")
    with pytest.raises(ValueError, match=r"^card secret decodes to an empty key$"):
        card.secret_key("whsec_")
    assert card.secret_key(CARD_SECRET) == b"card-key-for-tests"


def test_card_message_ids_are_fresh_per_body_and_time() -> None:
    first = card.signed_headers(BODY, CARD_SECRET, NOW)
    assert first["webhook-id"].startswith("msg_") and len(first["webhook-id"]) == 20
    assert first["webhook-timestamp"] == str(NOW)
    assert card.signed_headers(BODY, CARD_SECRET, NOW + 1)["webhook-id"] != first["webhook-id"]
    assert card.signed_headers(b"{}", CARD_SECRET, NOW)["webhook-id"] != first["webhook-id"]


def test_paymos_refusals() -> None:
    good = paymos.sign(BODY, "s")
    assert reason(paymos.verify, BODY, {}, ("s",)) == "missing X-Paymos-Signature header"
    assert reason(paymos.verify, BODY, {"X-Paymos-Signature": "sha256=zz,md5=00,sha256"}, ("s",)) == \
        "X-Paymos-Signature has no sha256= entry"
    assert reason(paymos.verify, BODY, {"X-Paymos-Signature": good}, ("t",)) == "no X-Paymos-Signature matches"
    paymos.verify(BODY, {"X-Paymos-Signature": f"sha256=zz, {good}"}, ("s",), NOW)


def test_stripe_refusals() -> None:
    good = stripe.sign(BODY, "whsec_s", NOW)
    assert reason(stripe.verify, BODY, {}, ("whsec_s",)) == "missing Stripe-Signature header"
    assert reason(stripe.verify, BODY, {"Stripe-Signature": f"t=0{NOW},v1={good}"}, ("whsec_s",)) == \
        "timestamp has a leading zero"
    assert reason(stripe.verify, BODY, {"Stripe-Signature": f"t={NOW},v0={good}"}, ("whsec_s",)) == \
        "Stripe-Signature has no v1 entry"
    assert reason(stripe.verify, BODY, {"Stripe-Signature": f"t={NOW},v1={good}"}, ("whsec_o",)) == \
        "no Stripe-Signature v1 matches"
    # the first t counts, a later one is ignored
    stripe.verify(BODY, {"Stripe-Signature": f"t={NOW},t=1,v1={good}"}, ("whsec_s",), NOW)
    assert stripe.parse_header(f"t={NOW},t=5,v1={good},v1=short") == (str(NOW), [bytes.fromhex(good)])
    with pytest.raises(ValueError, match=r"^stripe secret is empty \(an empty HMAC key is forgeable\)$"):
        stripe.secret_key("  ")


def adyen_item(**extra: object) -> dict[str, object]:
    return {"pspReference": "PSP1", "merchantAccountCode": "M", "merchantReference": "R",
            "amount": {"value": 100, "currency": "EUR"}, "eventCode": "AUTHORISATION", "success": "true",
            "eventDate": "2026-01-01T00:00:00+00:00", **extra}


def with_signature(value: object) -> bytes:
    item = adyen_item(additionalData={"hmacSignature": value})
    return orjson.dumps({"live": "false", "notificationItems": [{"NotificationRequestItem": item}]})


def test_adyen_refusals() -> None:
    keys = (ADYEN_KEY,)
    assert reason(adyen.verify, BODY, {}, ("not hex",)) == "no hex key configured for adyen"
    assert reason(adyen.verify, b"[", {}, keys) == "not an Adyen notification: no notificationItems to verify"
    assert reason(adyen.verify, b'{"notificationItems": []}', {}, keys) == "notificationItems is empty: nothing signed"
    assert reason(adyen.verify, with_signature(""), {}, keys) == "additionalData.hmacSignature missing"
    assert reason(adyen.verify, with_signature(None), {}, keys) == "additionalData.hmacSignature missing"
    assert reason(adyen.verify, with_signature("!!!!"), {}, keys) == "additionalData.hmacSignature is not base64"
    assert reason(adyen.verify, with_signature("AAAA"), {}, keys) == "notificationItems[0]: no hmacSignature matches"
    good = adyen.sign_item(adyen_item(), ADYEN_KEY)
    # a bad key before a good one, a bad entry before the good signature: skipped, not fatal
    adyen.verify(with_signature(f"!!!!, {good}"), {}, ("not hex", ADYEN_KEY), NOW)


def test_adyen_basic_auth() -> None:
    expected = "Basic " + base64.b64encode(b"user:pass").decode()
    adyen.check_basic_auth({"Authorization": expected}, "user:pass")
    for offered in ({}, {"Authorization": ""}, {"Authorization": "Basic dXNlcjpvdGhlcg=="}):
        with pytest.raises(SignatureError, match=r"^basic auth missing or wrong$"):
            adyen.check_basic_auth(offered, "user:pass")


def test_adyen_signing_keeps_live_and_the_other_additional_data() -> None:
    body = orjson.loads(adyen.sign_body([adyen_item(additionalData={"a": "b"})], ADYEN_KEY))
    assert body["live"] == "false"
    extra = body["notificationItems"][0]["NotificationRequestItem"]["additionalData"]
    assert extra["a"] == "b" and extra["hmacSignature"] == adyen.sign_item(adyen_item(), ADYEN_KEY)
    live = orjson.dumps({"live": "true", "notificationItems": [{"NotificationRequestItem": adyen_item()}]})
    assert orjson.loads(adyen.sign_request(live, ADYEN_KEY))["live"] == "true"
    unsaid = orjson.dumps({"notificationItems": [{"NotificationRequestItem": adyen_item()}]})
    assert orjson.loads(adyen.sign_request(unsaid, ADYEN_KEY))["live"] == "false"
    lone = orjson.loads(adyen.sign_request(orjson.dumps(adyen_item()), ADYEN_KEY))
    assert lone["live"] == "false" and len(lone["notificationItems"]) == 1
    adyen.verify(adyen.sign_request(live, ADYEN_KEY), {}, (ADYEN_KEY,), NOW)


def test_a_card_secret_with_a_character_outside_base64_is_refused_not_skipped() -> None:
    # without validation base64 would drop the space and read "test": a mistyped secret must fail loudly
    with pytest.raises(ValueError, match="card secret is not base64 after 'whsec_'"):
        card.secret_key("whsec_dGVz dA==")
    assert card.secret_key("whsec_dGVzdA==") == b"test"


def test_stripe_a_lone_zero_is_a_timestamp_and_a_zero_before_any_digit_is_leading() -> None:
    # near the epoch (a clock the tests set), one digit is the whole number: "0" has no leading zero
    stripe.verify(BODY, {"Stripe-Signature": f"t=0,v1={stripe.sign(BODY, 'whsec_s', 0)}"}, ("whsec_s",), 100)
    sig = stripe.sign(BODY, "whsec_s", 5)
    with pytest.raises(SignatureError, match=r"^timestamp has a leading zero$"):
        stripe.verify(BODY, {"Stripe-Signature": f"t=05,v1={sig}"}, ("whsec_s",), 100)


def test_adyen_signatures_are_split_at_commas_and_each_stripped() -> None:
    one, two = base64.b64encode(b"x" * 32).decode(), base64.b64encode(b"y" * 32).decode()
    item = msgspec.convert(adyen_item(additionalData={"hmacSignature": f"{one}, {two}"}), adyen._SignedItem)
    assert adyen._offered(item) == [b"x" * 32, b"y" * 32]


def test_paymos_signatures_are_split_at_commas_even_without_a_space() -> None:
    paymos.verify(BODY, {"X-Paymos-Signature": f"{paymos.sign(BODY, 's')},sha256=00"}, ("s",), NOW)


def test_pg_an_entry_is_cut_at_its_first_equals_sign() -> None:
    # "t==…" is a timestamp "=…" (refused as such), not an unknown key "t=" (which would read as no t=)
    assert reason(pg.verify, BODY, {"PG-Signature": f"t=={NOW},v1=00"}, ("s",)) == \
        "timestamp is not 1-12 ASCII digits"


@pytest.mark.parametrize(("field", "changed"), [
    ("pspReference", {"pspReference": 1.5}), ("originalReference", {"originalReference": [1]}),
    ("merchantAccountCode", {"merchantAccountCode": {}}), ("merchantReference", {"merchantReference": 2.0}),
    ("amount.value", {"amount": {"value": 1.5, "currency": "EUR"}}),
    ("amount.value", {"amount": {"value": True, "currency": "EUR"}}),  # a bool is no integer
    ("amount.currency", {"amount": {"value": 100, "currency": 7.0}}),
    ("eventCode", {"eventCode": False}), ("success", {"success": 0.0})])
def test_adyen_a_signed_field_of_another_type_is_refused_by_name(field: str, changed: dict[str, object]) -> None:
    item = msgspec.convert(adyen_item(**changed), adyen._SignedItem)
    with pytest.raises(SignatureError) as caught:
        adyen.signing_string(item)
    assert caught.value.reason == f"{field} is neither text nor an integer: cannot be signed"


def test_adyen_signs_an_integer_in_decimal_and_a_missing_field_as_empty() -> None:
    item = msgspec.convert({**adyen_item(amount={"value": 100}), "merchantReference": None}, adyen._SignedItem)
    assert adyen.signing_string(item) == b"PSP1::M::100::AUTHORISATION:true"


def test_adyen_secret_refusals_say_why() -> None:
    with pytest.raises(ValueError) as not_hex:
        adyen.secret_key("not hex")
    assert str(not_hex.value) == "adyen secret is not a hex key"
    with pytest.raises(ValueError) as empty:
        adyen.secret_key("  ")
    assert str(empty.value) == "adyen secret is an empty key"
    assert adyen.secret_key(" 0aFF ") == b"\x0a\xff"
